"""The run browser in a real headless Chromium (Debian's chromium + chromium-driver, scripts/browser_up.sh) over
a finished run folder of the training program (a tiny RSR -> RPR plan with the scripted RSR policy and real
Docker episodes), served by ``python -m rsi_jax.view`` itself: the run page lists the lineage's phases, the step
page's table sorts and filters, an episode page shows exactly the recorded turns, commands and checks, and its
value / advantage bars carry the recorded numbers; a screenshot of every page kind goes to the test's folder
(``$RSI_VIEW_SCREENSHOTS`` also keeps them)."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from rsi_jax.env.transcripts import read_transcripts

pytestmark = [pytest.mark.slow, pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
TINY = ["run.progress=false", "mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2",
        "rollout.global_batch=4", "rollout.requested=4", "rollout.max_new_tokens=16", "env.max_turns=2",
        "env.max_tasks=2", "rsr.max_tasks=1", "pipeline.sft_epochs=1", "pipeline.rollout_steps=1",
        "pipeline.critic_only_steps=0", "pipeline.checkpoint_every=1", "rl.minibatches=1", "eval.max_tasks=1",
        "eval.repeats=1"]


def _browser_paths():
  chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
  driver = shutil.which("chromedriver")
  if not chrome or not driver:
    pytest.skip("no chromium / chromedriver on this machine (scripts/browser_up.sh installs Debian's as root)")
  return chrome, driver


@pytest.fixture(scope="module")
def browser():
  chrome, driver_path = _browser_paths()
  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service
  opts = webdriver.ChromeOptions()
  opts.binary_location = chrome
  for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1100,900"):
    opts.add_argument(a)
  d = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
  d.set_page_load_timeout(60)
  yield d
  d.quit()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, docker_client):
  from rsi_jax.config import CONFIG_DIR, load_config
  from rsi_jax.pipeline.driver import Driver
  out = tmp_path_factory.mktemp("viewrun")
  # a two-phase plan with the command line's settings only (no per-phase values from the run file)
  ov = [f"run.output_dir={out}", "run.name=v", "pipeline.phases=[rsr1, rpr1]", "pipeline.phase_overrides={}", *TINY]
  Driver(load_config(CONFIG_DIR / "smoke.yml", ov), ov).run()
  return out / "v"


@pytest.fixture(scope="module")
def server(run_dir):
  p = subprocess.Popen([sys.executable, "-m", "rsi_jax.view", str(run_dir), "--port=0"], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  line = p.stdout.readline()
  assert line.startswith("serving "), (line, p.stderr.read() if p.poll() is not None else "")
  url = line.split(" at ", 1)[1].split()[0].rstrip("/")
  yield url
  p.terminate()
  p.wait(timeout=30)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
  d = tmp_path_factory.mktemp("screenshots")
  yield d
  keep = os.environ.get("RSI_VIEW_SCREENSHOTS")
  if keep:
    shutil.copytree(d, keep, dirs_exist_ok=True)


def _get(browser, url):
  browser.get(url)
  assert "not found" not in browser.title and "error" != browser.title, browser.page_source[:500]


def _css(browser, sel):
  from selenium.webdriver.common.by import By
  return browser.find_elements(By.CSS_SELECTOR, sel)


def _text(el) -> str:
  return el.get_attribute("textContent")


def _html(s: str) -> str:
  """What an HTML parser makes of text: line ends normalized, NUL replaced."""
  return s.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "\ufffd")


def test_run_page_lists_every_phase_of_the_lineage(browser, server, run_dir, shots):
  lineage = json.loads((run_dir / "lineage.json").read_text())
  _get(browser, server + "/")
  assert [_text(a) for a in _css(browser, "#plan a.phase-link")] == [e["phase"] for e in lineage] == ["rsr1", "rpr1"]
  rows = _css(browser, "#plan tbody tr")
  for row, e in zip(rows, lineage):  # the weight lineage: where each phase's weights came from, where they went
    cells = [_text(c) for c in row.find_elements("css selector", "td")]
    assert cells[4] == e["started_from"]["actor"] and cells[6] == e["output"] and cells[7] == e["actor_digest"]
  metrics = {s.get_attribute("data-metric") for s in _css(browser, "svg.curve")}
  assert {"reward", "success", "explained variance", "SFT NLL per token"} <= metrics
  evals = [_text(a) for a in _css(browser, "#evals tbody tr td:first-child a")]
  assert len(evals) == 3 and evals[0] == "base step 0" and evals[1].startswith("rsr1 step ") \
      and evals[2] == "rpr1 step 1"  # the starting actor's, then each phase's final weights
  browser.save_screenshot(str(shots / "run.png"))


def test_step_page_lists_sorts_and_filters_the_steps_episodes(browser, server, run_dir, shots):
  recs = read_transcripts(run_dir / "phases" / "rpr1" / "episodes" / "1.jsonl.gz")
  assert len(recs) == 4  # run.keep_transcripts: all, rollout.global_batch episodes
  _get(browser, f"{server}/step?{urllib.parse.urlencode({'phase': 'rpr1', 'step': 1})}")
  rows = _css(browser, "#episodes tbody tr")
  assert sorted(_text(r.find_element("css selector", "a.episode-link")) for r in rows) == \
      sorted(r["episode_id"] for r in recs)
  box = _css(browser, "input[data-filter='task']")[0]
  box.send_keys(recs[1]["task"])
  visible = [r for r in _css(browser, "#episodes tbody tr") if r.is_displayed()]
  assert [_text(r.find_elements("css selector", "td")[1]) for r in visible] == \
      [r["task"] for r in recs if recs[1]["task"] in r["task"]]
  box.clear()
  box.send_keys("no such task")
  assert not [r for r in _css(browser, "#episodes tbody tr") if r.is_displayed()]
  box.clear()
  box.send_keys(" ")
  box.clear()
  _css(browser, "#episodes th")[1].click()  # sort by task
  _css(browser, "#episodes th")[1].click()  # and back the other way
  tasks = [_text(r.find_elements("css selector", "td")[1]) for r in _css(browser, "#episodes tbody tr")]
  assert tasks == sorted(tasks, reverse=True)
  browser.save_screenshot(str(shots / "step.png"))


def test_episode_page_shows_exactly_the_recorded_turns_checks_and_values(browser, server, run_dir, shots):
  src = "phases/rpr1/episodes/1.jsonl.gz"
  recs = read_transcripts(run_dir / src)
  for i, rec in enumerate(recs):
    _get(browser, f"{server}/episode?{urllib.parse.urlencode({'src': src, 'i': i})}")
    turns = _css(browser, "div.turn")
    assert [int(t.get_attribute("data-turn")) for t in turns] == [t["index"] for t in rec["turns"]]
    assert [_text(p) for p in _css(browser, "pre.reply")] == [_html(t["reply"]) for t in rec["turns"]]
    assert [_text(p) for p in _css(browser, "pre.command")] == [_html(t["command"]) for t in rec["turns"]
                                                                if t["command"] is not None]
    assert [_text(p) for p in _css(browser, "pre.output")] == [_html(t["output"]) for t in rec["turns"]
                                                               if t["command"] is not None or t["output"]]
    assert [_text(s) for s in _css(browser, "#checks .check-name")] == [c["name"] for c in rec["checks"]]
    assert rec["checks"] and _text(_css(browser, "pre.instruction")[0]) == _html(rec["instruction"])
    for kind in ("value", "advantage"):
      drawn = {int(b.get_attribute("data-turn")): float(b.get_attribute("data-value"))
               for b in _css(browser, f"svg.bar[data-kind='{kind}']")}
      recorded = {t["index"]: t[kind] for t in rec["turns"] if t[kind] is not None}
      assert drawn == recorded and recorded  # every trained turn has its bar, with the recorded number
    if i == 0:
      browser.save_screenshot(str(shots / "episode.png"))


def test_rsr_funnel_and_evaluation_pages(browser, server, run_dir, shots):
  _get(browser, f"{server}/rsr?phase=rsr1")
  disc = read_transcripts(run_dir / "phases" / "rsr1" / "episodes" / "discovery.jsonl.gz")
  assert [f.get_attribute("data-task") for f in _css(browser, "div.funnel")] == \
      list(dict.fromkeys(r["task"] for r in disc))
  assert _css(browser, "div.funnel pre")  # the runbooks' text
  browser.save_screenshot(str(shots / "rsr.png"))
  _get(browser, f"{server}/evaluation?phase=rpr1&step=1")
  links = _css(browser, "#attempts a.episode-link")
  assert len(links) == 1
  links[0].click()
  time.sleep(0.2)
  assert _css(browser, "div.turn")
  browser.save_screenshot(str(shots / "evaluation-attempt.png"))
  _get(browser, f"{server}/evaluation?phase=rpr1&step=1")
  browser.save_screenshot(str(shots / "evaluation.png"))
  assert {p.name for p in shots.iterdir()} >= {"run.png", "step.png", "episode.png", "rsr.png", "evaluation.png"}


def test_tensorboard_shows_a_few_episodes_per_step_as_text(run_dir):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  ea = EventAccumulator(str(run_dir / "tensorboard" / "episodes"), size_guidance={"tensors": 0})
  ea.Reload()
  (tag,) = [t for t in ea.Tags()["tensors"] if t.startswith("rpr1/episodes")]
  (ev,) = ea.Tensors(tag)
  text = ev.tensor_proto.string_val[0].decode()
  recs = read_transcripts(run_dir / "phases" / "rpr1" / "episodes" / "1.jsonl.gz")
  assert ev.step == 1 and sum(f"**{r['task']}**" in text for r in recs) >= 2 and text.count("---") == 2  # 3 of 4
  assert "value " in text and "advantage " in text
