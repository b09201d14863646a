"""The `respd` command line's settings on a real server (the model-free checks are in
tests/unit/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.servers import start_server


def test_alias_template_and_env_configuration(tmp_path: Path) -> None:
    """A server configured through env vars and a --chat-template override."""
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    srv = start_server(
        tmp_path,
        "--chat-template",
        str(template),
        env={"RESPD_MODEL_ALIAS": "tiny", "RESPD_CTX_SIZE": "512", "RESPD_THREADS": "1"},
    )
    try:
        models = httpx.get(srv.base_url + "/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert models["data"][0]["context_window"] == 512
        r = httpx.post(
            srv.base_url + "/v1/responses",
            json={"model": "tiny", "input": "hi", "max_output_tokens": 2},
            timeout=60,
        )
        assert r.status_code == 200
        # The override template has no default system prompt, unlike SmolLM2's own.
        assert r.json()["usage"]["input_tokens"] < 15
        log = srv.log()
        assert "tiny" in log and f"http://127.0.0.1:{srv.port}/v1" in log
    finally:
        srv.stop()
    srv.assert_no_5xx()
