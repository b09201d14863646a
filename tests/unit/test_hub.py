"""Hub model references, and which GGUF (and projector) of a repository a pull takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from respd import hub
from respd.hub import HubRef, matching_mmproj, parse_ref, pick_file, split_parts

REPO = [
    "README.md",
    ".gitattributes",
    "mmproj-Model-f16.gguf",
    "mmproj-Model-Q8_0.gguf",
    "Model-IQ4_XS.gguf",
    "Model-Q2_K.gguf",
    "Model-Q4_0.gguf",
    "Model-Q4_K_M.gguf",
    "Model-Q4_K_S.gguf",
    "Model-Q8_0.gguf",
    "Model-F16.gguf",
    "Model-BF16.gguf",
]


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("hf://owner/name", HubRef("owner/name")),
        ("hf://owner/name:Q4_K_M", HubRef("owner/name", quant="Q4_K_M")),
        ("hf://owner/name:q8_0", HubRef("owner/name", quant="q8_0")),
        ("hf://owner/name:Model-F16.gguf", HubRef("owner/name", file="Model-F16.gguf")),
        (
            "hf://o/n.v2:sub/dir/Model.Q4_K_M.gguf",
            HubRef("o/n.v2", file="sub/dir/Model.Q4_K_M.gguf"),
        ),
        ("owner/name:Q4_K_M", HubRef("owner/name", quant="Q4_K_M")),
        ("owner/name", HubRef("owner/name")),
        ("hf.co/owner/name:Q4_K_M", HubRef("owner/name", quant="Q4_K_M")),
        ("https://huggingface.co/owner/name", HubRef("owner/name")),
    ],
)
def test_parse_ref(text: str, ref: HubRef) -> None:
    assert parse_ref(text) == ref


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hf://",
        "hf://owner",
        "hf://owner/name/extra",
        "hf://owner/name:",
        "hf://owner/name:Q4 K M",
        "hf://owner/name:../../etc/passwd.gguf",
        "hf://../name",
        "/models/x.gguf",
    ],
)
def test_parse_ref_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"hf://|quant|file"):
        parse_ref(text)


def test_ref_prints_as_it_is_written() -> None:
    assert str(parse_ref("owner/name:Q4_K_M")) == "hf://owner/name:Q4_K_M"
    assert str(parse_ref("hf://owner/name")) == "hf://owner/name"


@pytest.mark.parametrize(
    ("quant", "picked"),
    [
        ("Q4_K_M", "Model-Q4_K_M.gguf"),
        ("q4_k_m", "Model-Q4_K_M.gguf"),
        ("q8_0", "Model-Q8_0.gguf"),
        ("F16", "Model-F16.gguf"),  # not BF16: a whole token
        ("bf16", "Model-BF16.gguf"),
        ("IQ4_XS", "Model-IQ4_XS.gguf"),
        ("Q4_0", "Model-Q4_0.gguf"),
        ("Model-Q2_K.gguf", "Model-Q2_K.gguf"),  # an exact name
        (None, "Model-Q4_K_M.gguf"),
    ],
)
def test_pick_file(quant: str | None, picked: str) -> None:
    assert pick_file(REPO, quant) == picked


def test_a_quant_is_a_whole_token() -> None:
    """Q4_K names neither Q4_K_M nor Q4_K_S; Q4 names none of them."""
    for quant in ("Q4_K", "Q4", "K_M", "4_K_M"):
        with pytest.raises(ValueError, match="available quants"):
            pick_file(REPO, quant)


def test_names_with_dots_and_underscores() -> None:
    files = ["smollm2-135m-instruct.q8_0.gguf", "smollm2_135m_instruct_q4_k_m.gguf"]
    assert pick_file(files, "Q8_0") == "smollm2-135m-instruct.q8_0.gguf"
    assert pick_file(files, "Q4_K_M") == "smollm2_135m_instruct_q4_k_m.gguf"


@pytest.mark.parametrize(
    ("files", "picked"),
    [
        (["M-Q8_0.gguf", "M-Q4_0.gguf"], "M-Q4_0.gguf"),
        (["M-Q8_0.gguf", "M-F16.gguf"], "M-Q8_0.gguf"),
        (["M-F16.gguf", "M-Q3_K_L.gguf"], "M-F16.gguf"),  # none preferred: the first
        (["mmproj-M-f16.gguf", "only.gguf"], "only.gguf"),
    ],
)
def test_default_order(files: list[str], picked: str) -> None:
    assert pick_file(files, None) == picked


def test_projector_is_never_the_model() -> None:
    assert pick_file(REPO, "f16") == "Model-F16.gguf"
    with pytest.raises(ValueError, match="projector"):
        pick_file(REPO, "mmproj-Model-f16.gguf")
    with pytest.raises(ValueError, match="no model GGUF"):
        pick_file(["mmproj-x-f16.gguf", "README.md"], None)


def test_errors_list_the_quants() -> None:
    with pytest.raises(ValueError) as info:
        pick_file(REPO, "Q5_K_M")
    message = str(info.value)
    assert "Q5_K_M" in message
    for quant in ("BF16", "F16", "IQ4_XS", "Q2_K", "Q4_0", "Q4_K_M", "Q4_K_S", "Q8_0"):
        assert quant in message
    assert "mmproj" not in message  # projectors are not models to choose from
    with pytest.raises(ValueError, match=r"no file 'Model-Q9\.gguf'.*Q4_K_M"):
        pick_file(REPO, "Model-Q9.gguf")


SPLIT = [
    "Big-Q4_K_M-00001-of-00003.gguf",
    "Big-Q4_K_M-00002-of-00003.gguf",
    "Big-Q4_K_M-00003-of-00003.gguf",
    "Q8_0/Big-Q8_0-00001-of-00002.gguf",
    "Q8_0/Big-Q8_0-00002-of-00002.gguf",
]


def test_a_split_model_is_named_by_its_first_part_and_pulled_whole() -> None:
    assert pick_file(SPLIT, "Q4_K_M") == "Big-Q4_K_M-00001-of-00003.gguf"
    assert pick_file(SPLIT, "q8_0") == "Q8_0/Big-Q8_0-00001-of-00002.gguf"
    assert split_parts(SPLIT, "Big-Q4_K_M-00001-of-00003.gguf") == SPLIT[:3]
    assert split_parts(SPLIT, "Q8_0/Big-Q8_0-00001-of-00002.gguf") == SPLIT[3:]
    assert split_parts(REPO, "Model-Q8_0.gguf") == ["Model-Q8_0.gguf"]
    with pytest.raises(ValueError, match="first part"):
        pick_file(SPLIT, "Big-Q4_K_M-00002-of-00003.gguf")
    with pytest.raises(ValueError, match=r"lacks parts: Big-Q4_K_M-00002-of-00003\.gguf"):
        split_parts([SPLIT[0], SPLIT[2]], SPLIT[0])


def test_matching_mmproj() -> None:
    assert matching_mmproj(REPO, "Model-Q8_0.gguf") == "mmproj-Model-Q8_0.gguf"
    assert matching_mmproj(REPO, "Model-F16.gguf") == "mmproj-Model-f16.gguf"
    assert matching_mmproj(REPO, "Model-Q4_K_M.gguf") == "mmproj-Model-f16.gguf"
    assert matching_mmproj(["a-Q4_K_M.gguf", "mmproj-a-BF16.gguf"], "a-Q4_K_M.gguf") == (
        "mmproj-a-BF16.gguf"
    )
    assert matching_mmproj(["a-Q4_K_M.gguf", "README.md"], "a-Q4_K_M.gguf") is None
    # A projector in another folder belongs to another model.
    assert matching_mmproj(["x/a.gguf", "y/mmproj-f16.gguf"], "x/a.gguf") is None


def test_settings_are_read_at_call_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The endpoint and the cache follow the env as it is when a pull starts (the
    library's own constants are frozen at its import)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/mirror/")
    monkeypatch.setenv("RESPD_HUB_CACHE", str(tmp_path))
    assert hub.hub_endpoint() == "http://127.0.0.1:9/mirror"
    assert hub.hub_cache_dir() == tmp_path
    assert hub.hub_cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("RESPD_HUB_CACHE")
    assert hub.hub_cache_dir() == Path.home() / ".cache/respd/hub"


def test_plain_paths_resolve_to_themselves() -> None:
    assert hub.resolve_model_ref("~/m.gguf") == Path.home() / "m.gguf"
    assert hub.resolve_model_ref("/models/a.gguf") == Path("/models/a.gguf")


def test_offline_pull_of_an_uncached_repo_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError, match=r"not in the cache .* offline"):
        hub.resolve_model_ref("hf://owner/name:Q4_K_M", cache_dir=tmp_path)


@pytest.mark.parametrize("name", ["../evil.gguf", "a/../../evil.gguf", "/etc/evil.gguf"])
def test_a_listed_name_outside_the_repository_is_refused(name: str, tmp_path: Path) -> None:
    """A hostile mirror's listing cannot make a pull write outside the cache."""
    remote = hub._Remote(name, 4, "0" * 64, None)
    with pytest.raises(hub.HubError, match="outside the repository"):
        hub._fetch(
            "o/n",
            None,
            remote,
            tmp_path / "o--n",
            endpoint="http://127.0.0.1:9",
            progress=False,
            say=print,
        )
    assert not any(tmp_path.iterdir())
