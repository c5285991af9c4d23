"""Every `nodewarden` command answers each kind of wrong input with one line and exit 2.

Each case runs the command line through `nodewarden.cli.main` and asserts: the exit code
(2: bad input or "could not run"), exactly one line on stderr, that the line names the
input (flag, file or variable), and no traceback (in-process, an exception escaping
`main` is what would print one). The cases run in-process to keep the suite fast; the
first case of every command also runs as a real `python -m nodewarden` subprocess and
must give the same answer. A command added to `nodewarden.cli.COMMANDS` without cases here
fails the completeness test. The wrapper for unexpected errors: one line and the
NODEWARDEN_DEBUG hint, or the traceback when it is set.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodewarden import cli

# a case whose input slipped through would start the operator in-process: fail, don't hang
pytestmark = pytest.mark.timeout(120)

NO_FILE = "/nonexistent/nodewarden-input"


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    names: str
    """Text the one stderr line must contain: the input it is about."""
    code: int = 2
    env: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return " ".join(self.argv)[:80]


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str


def _files(root: Path) -> dict[str, str]:
    files = {
        "bad_yaml": "not: [valid\n",
        "list_yaml": "- a\n- b\n",
        "no_context": "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
        "missing_context": "current-context: foo\ncontexts: []\nclusters: []\nusers: []\n",
        "no_cluster": (
            "current-context: c\ncontexts: [{name: c, context: {cluster: gone, user: u}}]\n"
            "clusters: []\nusers: [{name: u, user: {}}]\n"
        ),
        "missing_ca": (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', "
            "certificate-authority: /nonexistent/ca.crt}}]\nusers: [{name: u, user: {}}]\n"
        ),
        "kubeconfig": (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', "
            "insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: t}}]\n"
        ),
        "config_bad": "dispatcher_id: Not_A_Label\n",
        "config_unknown": "bogus_field: 1\n",
        "config_yaml": "dispatcher_id: [unclosed\n",
        "scenario_bad": "kind: NotAScenario\n",
        "trace_bad": "this,is,not\na,trace,file\n",
        "policy_bad": "spec: {idleThreshold: 10 minutes}\n",
    }
    out = {}
    for name, text in files.items():
        path = root / f"{name}.yaml"
        path.write_text(text)
        out[name] = str(path)
    binary = root / "binary"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    out["binary"] = str(binary)
    out["dir"] = str(root)
    return out


def _cases(f: dict[str, str], busy_port: int) -> list[Case]:
    kc = f["kubeconfig"]
    return [
        # run
        Case(("run", "--kubeconfig", NO_FILE), f"kubeconfig {NO_FILE}: no such file"),
        Case(("run", "--kubeconfig", f["dir"]), "is a directory"),
        Case(("run", "--kubeconfig", f["bad_yaml"]), f"{f['bad_yaml']}: not valid YAML at line"),
        Case(("run", "--kubeconfig", f["list_yaml"]), f"{f['list_yaml']}: empty or not a kube"),
        Case(("run", "--kubeconfig", f["binary"]), f"{f['binary']}: not a text file"),
        Case(("run", "--kubeconfig", f["no_context"]), "no current context"),
        Case(("run", "--kubeconfig", f["missing_context"]), "current context 'foo'"),
        Case(("run", "--kubeconfig", f["no_cluster"]), "names cluster 'gone'"),
        Case(("run", "--kubeconfig", f["missing_ca"]), "certificate-authority /nonexistent/ca.crt"),
        Case(("run", "--config", NO_FILE), NO_FILE),
        Case(("run", "--config", f["config_bad"]), "dispatcher_id"),
        Case(("run", "--config", f["config_unknown"]), "bogus_field"),
        Case(("run", "--config", f["config_yaml"]), f["config_yaml"]),
        Case(("run", "--http-port", "http"), "--http-port"),
        Case(("run", "--http-port", "99999"), "--http-port"),
        Case(("run", "--namespace", "Not_A_Namespace"), "--namespace"),
        Case(("run", "--log-level", "LOUD"), "--log-level"),
        Case(("run", "--log-format", "xml"), "--log-format"),
        Case(("run", "--resync-interval", "10 minutes"), "resync_interval"),
        Case(("run", "--dispatcher-id", "Not_A_Label"), "dispatcher_id"),
        Case(("run", "--frobnicate"), "--frobnicate"),
        Case(
            ("run", "--kubeconfig", kc, "--http-host", "127.0.0.1", "--http-port", str(busy_port)),
            f"cannot listen on 127.0.0.1:{busy_port}",
        ),
        Case(
            # refused before any lookup: tests send nothing beyond loopback, DNS included
            ("run", "--kubeconfig", kc, "--http-host", "no such host!"),
            "--http-host 'no such host!': not an IP address or host name",
        ),
        # check (exit 2: the checks could not run)
        Case(("check", "-o", "xml"), "-o/--output"),
        Case(("check", "--timeout", "0"), "--timeout"),
        Case(("check", "--operator-url", "ftp://operator"), "--operator-url"),
        Case(("check", "--as-serviceaccount", "Not_An_SA"), "--as-serviceaccount"),
        Case(("check", "--namespace", "Not_A_Namespace"), "--namespace"),
        Case(("check", "--kubeconfig", NO_FILE), f"kubeconfig {NO_FILE}: no such file"),
        Case(("check", "--kubeconfig", f["no_context"]), "no current context"),
        Case(("check", "--kubeconfig", NO_FILE, "--config", f["config_bad"]), f["config_bad"]),
        Case(
            ("check", "--kubeconfig", kc),
            "NODEWARDEN_CHECK_CLOCK_OFFSET",
            env=(("NODEWARDEN_CHECK_CLOCK_OFFSET", "two minutes"),),
        ),
        Case(("check", "--frobnicate"), "--frobnicate"),
        # explain
        Case(("explain",), "--scenario"),
        Case(("explain", "--scenario", NO_FILE), NO_FILE),
        Case(("explain", "--scenario", f["dir"]), f["dir"]),
        Case(("explain", "--scenario", f["bad_yaml"]), f["bad_yaml"]),
        Case(("explain", "--scenario", f["scenario_bad"]), f["scenario_bad"]),
        Case(("explain", "--scenario", f["scenario_bad"], "-o", "xml"), "-o/--output"),
        Case(("explain", "workernode"), "name"),
        Case(("explain", "workernode", "x", "-o", "xml"), "-o/--output"),
        Case(("explain", "workernode", "x", "--kubeconfig", NO_FILE), f"{NO_FILE}: no such file"),
        Case(("explain", "workernode", "x", "--kubeconfig", f["no_context"]), "no current context"),
        # crds
        Case(("crds", "--frobnicate"), "--frobnicate"),
        Case(("crds", "/proc/nodewarden-crds"), "/proc/nodewarden-crds"),
        # simulate
        Case(("simulate",), "--trace"),
        Case(("simulate", "--trace", NO_FILE, "--policy", "builtin:default"), NO_FILE),
        Case(
            ("simulate", "--trace", f["trace_bad"], "--policy", "builtin:default"), f["trace_bad"]
        ),
        Case(
            ("simulate", "--trace", "builtin:smoke", "--policy", f["policy_bad"]), f["policy_bad"]
        ),
        Case(("simulate", "--trace", "builtin:smoke", "--policy", NO_FILE), NO_FILE),
        Case(("simulate", "--trace", "builtin:nope", "--policy", "builtin:default"), "--trace"),
        Case(
            (
                "simulate",
                "--trace",
                "builtin:smoke",
                "--policy",
                "builtin:default",
                "--fleet",
                NO_FILE,
            ),
            NO_FILE,
        ),
        Case(
            ("simulate", "--trace", "builtin:smoke", "--policy", "builtin:default", "--seed", "x"),
            "--seed",
        ),
        # trace
        Case(("trace",), "command"),
        Case(("trace", "rewind"), "rewind"),
        Case(("trace", "generate", "-o", "-", "--days", "-1"), "--days"),
        Case(("trace", "generate", "-o", "-", "--preset", "nope"), "--preset"),
        Case(("trace", "export", "-o", "-", "--kubeconfig", NO_FILE), f"kubeconfig {NO_FILE}"),
        Case(("trace", "export", "-o", "-", "--kubeconfig", f["bad_yaml"]), f["bad_yaml"]),
        Case(("trace", "export", "-o", "-", "--kubeconfig", kc, "--since", "yesterday"), "--since"),
        # the command itself
        Case(("frobnicate",), "frobnicate"),
    ]


def _environment(home: Path, case: Case) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "NODEWARDEN_"))}
    env.update(HOME=str(home), **dict(case.env))
    return env


def _in_process(case: Case, home: Path) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith(("KUBECONFIG", "NODEWARDEN_"))]:
            patch.delenv(key)
        for key, value in {"HOME": str(home), **dict(case.env)}.items():
            patch.setenv(key, value)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(case.argv))
            except SystemExit as exc:  # argparse's own exit: a usage block, not one line
                code = int(exc.code or 0)
    return Outcome(code, out.getvalue(), err.getvalue())


def _subprocess(case: Case, home: Path) -> Outcome:
    proc = subprocess.run(
        [sys.executable, "-m", "nodewarden", *case.argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environment(home, case),
        check=False,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")  # no ~/.kube/config


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory, busy_port: int) -> list[Case]:
    return _cases(_files(tmp_path_factory.mktemp("cli-inputs")), busy_port)


@pytest.fixture(scope="module")
def outcomes(cases: list[Case], home: Path) -> dict[Case, Outcome]:
    return {case: _in_process(case, home) for case in cases}


def _problem(case: Case, got: Outcome) -> str | None:
    lines = got.stderr.splitlines()
    if (
        got.code != case.code
        or len(lines) != 1
        or case.names not in lines[0]
        or "Traceback" in got.stderr + got.stdout
    ):
        return f"{case.id!r}: exit {got.code}, stderr {got.stderr!r}"
    return None


def test_every_command_has_wrong_input_cases(outcomes: dict[Case, Outcome]) -> None:
    covered = {case.argv[0] for case in outcomes}
    assert set(cli.COMMANDS) <= covered, set(cli.COMMANDS) - covered


def test_each_wrong_input_is_one_line_naming_it_with_exit_2(
    outcomes: dict[Case, Outcome],
) -> None:
    problems = [p for p in (_problem(c, o) for c, o in outcomes.items()) if p]
    assert problems == [], "\n".join(problems)


def test_the_real_command_line_answers_the_same(cases: list[Case], home: Path) -> None:
    """One case per command as a subprocess: the entry point adds no traceback or lines."""
    first = {}
    for case in cases:
        first.setdefault(case.argv[0], case)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: (c, _subprocess(c, home)), first.values()))
    problems = [p for p in (_problem(c, o) for c, o in results) if p]
    assert problems == [], "\n".join(problems)


def test_check_without_a_cluster_prints_the_failed_line_and_the_skipped_ones(
    outcomes: dict[Case, Outcome],
) -> None:
    got = next(o for c, o in outcomes.items() if c.argv == ("check", "--kubeconfig", NO_FILE))
    failed = [line for line in got.stdout.splitlines() if line.startswith("✗")]
    assert len(failed) == 1 and failed[0].split()[1] == "kubeconfig", got.stdout
    assert f"kubeconfig {NO_FILE}: no such file" in failed[0]
    assert "not checked: no usable kubeconfig" in got.stdout


def test_an_unexpected_error_is_one_line_with_the_debug_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(argv: list[str]) -> int:
        raise RuntimeError("the disk\nis on fire")

    monkeypatch.setitem(cli.COMMANDS, "explain", broken)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["explain"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "nodewarden explain: unexpected error: RuntimeError: the disk is on fire "
        "(run with NODEWARDEN_DEBUG=1 for the traceback)"
    ]
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(RuntimeError, match="on fire"):
        cli.main(["explain"])


def test_unreadable_kubeconfig_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = tmp_path / "kubeconfig"
    path.write_text("current-context: c\n")
    path.chmod(0)
    got = _subprocess(Case(("run", "--kubeconfig", str(path)), ""), tmp_path)
    assert got.code == 2 and got.stderr.startswith(
        f"nodewarden run: kubeconfig {path}: cannot read"
    )
