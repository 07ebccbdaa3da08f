"""The environment tests' fixtures (tokenizer, renderer, Docker settings, the no-container-left check)."""

from tests.env.conftest import no_container_left_behind, renderer, run_id, settings, tokenizer  # noqa: F401
