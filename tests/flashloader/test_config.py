"""flash-loader configuration: defaults, FLASH_* environment, verify spellings, flags, errors."""

from __future__ import annotations

import pytest

from flexinfer.flashloader import config as fconf
from flexinfer.settings import SettingsError

# ---- configuration ---------------------------------------------------------------------------


def test_config_defaults_and_env() -> None:
    cfg = fconf.load_config({"FLASH_SRC": "/s", "FLASH_DST": "/d"})
    assert (cfg.concurrency, cfg.buffer_kb, cfg.verify, cfg.variant) == (4, 4096, "none", "")
    assert cfg.exclude == (".cache/", ".git/")
    env = {"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "8", "FLASH_BUFFER_KB": "1024",
           "FLASH_VERIFY": "sha256", "FLASH_EXCLUDE": "original/, ./logs/,,", "FLASH_VARIANT": "fp16"}
    cfg = fconf.load_config(env)
    assert (cfg.concurrency, cfg.buffer_kb, cfg.verify, cfg.variant) == (8, 1024, "sha256", "fp16")
    assert cfg.exclude == (".cache/", ".git/", "original/", "logs/")
    assert cfg.buffer_bytes == 1024 * 1024


@pytest.mark.parametrize(("raw", "mode"), [("false", "none"), ("", "none"), ("0", "none"), ("true", "size"),
                                           ("1", "size"), ("SIZE", "size"), ("sha256", "sha256")])
def test_verify_spellings(raw: str, mode: str) -> None:
    assert fconf.load_config({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_VERIFY": raw}).verify == mode


def test_flags_override_env() -> None:
    env = {"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "8", "FLASH_EXCLUDE": "a/"}
    cfg = fconf.load_config(env, dst="/other", concurrency=2, exclude=("b/",), verify=None)
    assert (cfg.src, cfg.dst, cfg.concurrency) == ("/s", "/other", 2)
    assert cfg.exclude == (".cache/", ".git/", "b/")


@pytest.mark.parametrize(("env", "needle"), [
    ({"FLASH_DST": "/d"}, "FLASH_SRC"),
    ({"FLASH_SRC": "/s"}, "FLASH_DST"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "0"}, "FLASH_CONCURRENCY"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_CONCURRENCY": "four"}, "FLASH_CONCURRENCY"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_BUFFER_KB": "1"}, "FLASH_BUFFER_KB"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_VERIFY": "md5"}, "FLASH_VERIFY"),
    ({"FLASH_SRC": "/s", "FLASH_DST": "/d", "FLASH_VARIANT": "../x"}, "FLASH_VARIANT"),
])
def test_config_errors(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        fconf.load_config(env)
