#!/usr/bin/env bash
# The learning check: the real training program on CPU with real Docker (configs/learn_check.yml) on a generated
# task suite (rsi_jax/env/learn_tasks.py): Base (a short SFT warm start, a stand-in for a pre-trained base) ->
# RSR-1 (verified self-imitation) -> critic seed -> RPR-1 (PPO, FDR rewards, TB-GAE), held-out Mean@3 / pass@3
# after each stage. Ends by printing the table (also <run>/learn_check.json) and the stage report with its
# plots (<run>/eval/report/).
#   bash scripts/learn_check.sh [SEED] [--stand-in-base | --multi-step] [key=value ...]
#     (SEED default 0; overrides go to rsi_jax.train)
#   --stand-in-base: Base is the corpus-trained stand-in (configs/stand_in_base.yml, model qwen3-tiny-8x128),
#     trained once into runs/stand_in_base and exported to runs/stand_in_base/hf, which every seed's run imports
#     (model.hf_path) and evaluates as its starting weights; the plan is then RSR-1 -> critic seed -> RPR-1
#   --multi-step: the same on the multi-step task families (configs/learn_check_multi.yml: 2-3 commands a task,
#     four turns), from the multi-step stand-in Base (configs/stand_in_base_multi.yml: the stand-in Base trained
#     on further under that harness, once, into runs/stand_in_base_multi); then RSR-1 again with the rewrite on
#     (scripts/learn_check_rewrite.py), and the funnel comparison of the two RSR-1s. Before the plan, the
#     discovery gate (scripts/learn_check_gate.py): the Base's sampled success on the suite's validation split
#     (8 tasks a family, none held-out; 2 attempts each at the rollout's sampling) must reach 10%, or the check
#     stops there with exit status 3 (--no-gate, after --multi-step, runs it anyway)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seed=0
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then seed=$1; shift; fi
stand_in=0 multi=0
if [ $# -gt 0 ] && [ "$1" = "--stand-in-base" ]; then stand_in=1; shift;
elif [ $# -gt 0 ] && [ "$1" = "--multi-step" ]; then stand_in=1 multi=1; shift; fi
gate=$multi
if [ "$multi" = 1 ] && [ $# -gt 0 ] && [ "$1" = "--no-gate" ]; then gate=0; shift; fi
py=$(bash scripts/setup.sh | tail -n 1)
bash scripts/docker_up.sh
bash scripts/build_base_image.sh bookworm
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

# train_base CONFIG RUN: a stand-in Base, trained once for every seed (a pre-trained base is one model): a finished
# training is "done earlier" at once, an interrupted one resumes; exported to RUN/hf again only when its final
# checkpoint is not the one RUN/hf/SOURCE names
train_base() {
  local config=$1 run=$2 final
  "$py" -m rsi_jax.train --config="$config"
  final=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))[-1]["output"])' "$run/lineage.json")
  if [ ! -f "$run/hf/config.json" ] || [ "$(cat "$run/hf/SOURCE" 2>/dev/null)" != "$final" ]; then
    "$py" -m rsi_jax.models.export --checkpoint="$run/$final" --out="$run/hf"
    echo "$final" > "$run/hf/SOURCE"
  fi
}

name="learn_check_s$seed"
check_config=configs/learn_check.yml
templates=one-command
heldout=4
val=0
base=24  # the scripted warm start's demonstrations (rsr0); a stand-in Base's runs have no rsr0 but keep the split
base_args=()
label="init (random)"
if [ "$stand_in" = 1 ]; then
  name="learn_check_stand_in_s$seed"
  train_base configs/stand_in_base.yml runs/stand_in_base
  # unpacked rows, as configs/stand_in_base.yml (at 8 layers, packed rows of 2,048 tokens cost 4x per update)
  base_args=(model_name=qwen3-tiny-8x128 "model.hf_path=runs/stand_in_base/hf"
             "pipeline.phases=[rsr1, critic_seed, rpr1]" rl.per_device_token_budget=0 rl.pad_multiple=64)
  label="Base (stand-in: corpus)"
  if [ "$multi" = 1 ]; then  # trained on from runs/stand_in_base/hf (its model.hf_path); the check's config
    # names the model, its export and the plan
    name="learn_check_multi_s$seed"
    train_base configs/stand_in_base_multi.yml runs/stand_in_base_multi
    check_config=configs/learn_check_multi.yml
    templates=multi-step
    heldout=17  # 4 families x 17 = 68 held-out tasks: one task is 1.5 points of Mean@3
    base=0
    val=8
    base_args=()
  fi
fi
suite="runs/${name}_tasks"
# the suite and the seed's run file: the check's config with this suite's splits (a run file rather than
# key=value, which would win over the Base phase's own env.tasks_dir)
"$py" scripts/make_learn_tasks.py "$suite" --seed "$seed" --base "$base" --heldout "$heldout" --val "$val" --templates "$templates" --run-file "$check_config"
if [ "$gate" = 1 ]; then
  # the discovery gate: the Base (the run file's model) on the validation split, sampled as discovery samples
  gate_dir="runs/${name}_gate"
  rm -rf "$gate_dir"
  sampling=$("$py" -c 'import sys; from rsi_jax.config import load_config
c = load_config(sys.argv[1], sys.argv[2:]).rollout; print(f"eval.temperature={c.temperature} eval.top_p={c.top_p}")' \
    "$suite/run.yml" "$@")
  # shellcheck disable=SC2086  # two key=value words
  "$py" -m rsi_jax.eval --config="$suite/run.yml" --tasks_dir="$suite/val" --repeats=2 --output="$gate_dir" \
    $sampling "$@"
  "$py" scripts/learn_check_gate.py "$gate_dir/summary.json" --min 10 || exit $?
fi
start=$(date +%s)
rc=0
"$py" -m rsi_jax.train --config="$suite/run.yml" "run.name=$name" "run.seed=$seed" ${base_args[@]+"${base_args[@]}"} \
  "$@" || rc=$?
wall=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ]; then
  # say so rather than end quietly (the table below still shows the stages that were evaluated, if any)
  echo "[learn_check] rsi_jax.train exited with status $rc after ${wall}s" >&2
fi
"$py" scripts/learn_check_table.py "runs/$name" --wall-seconds "$wall" --start-label "$label" || [ "$rc" -ne 0 ]
if [ "$rc" -eq 0 ] && [ "$multi" = 1 ]; then
  # the design's point: RSR-1 with the rewrite on (the actor plans two runbooks per discovered episode, the review
  # gate, fresh executions under them, projection) from the same Base, seed and tasks, beside this run's RSR-1
  # (self-imitation): its table, then the funnel comparison (runs/${name}_rewrite/rewrite_comparison.json)
  start=$(date +%s)
  "$py" scripts/learn_check_rewrite.py "runs/$name" --num-runbooks 2 "$@" || rc=$?
  echo "[learn_check] the rewrite's RSR-1: $(( $(date +%s) - start ))s"
fi
exit "$rc"
