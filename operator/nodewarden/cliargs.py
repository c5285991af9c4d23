"""Command-line input that fails in one line: the commands' argparse base, YAML mistakes.

argparse prints its usage block and exits on a bad flag; `Parser.error` raises
`UsageError` instead, and `nodewarden.cli.main` prints it as one line naming the flag
and exits 2. The `type=` helpers check values at parse time so that a bad value is
reported against its flag (`--http-port: 99999 is not a port number 0..65535`).
`yaml_mistake` says where a YAML file the user named is malformed, in one line (PyYAML's
own message spans several lines and quotes the input).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import NoReturn

import yaml

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class UsageError(ValueError):
    """A command line the command cannot use; the message names the flag or argument."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are `UsageError` (one line) instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def dns_label(flag: str) -> Callable[[str], str]:
    """A type= for names Kubernetes requires to be DNS labels (namespaces, ServiceAccounts)."""

    def parse(text: str) -> str:
        if not _DNS_LABEL.match(text):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a valid name (lower-case letters, digits and '-', at most 63)"
            )
        return text

    parse.__name__ = flag
    return parse


def port(text: str) -> int:
    """A type= for TCP ports (0 = pick a free one)."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number 0..65535")
    return int(text)


def positive_seconds(flag: str) -> Callable[[str], float]:
    """A type= for a number of seconds greater than 0."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
        return value

    parse.__name__ = flag
    return parse


def yaml_mistake(exc: yaml.YAMLError) -> str:
    """'not valid YAML at line 3, column 7 (expected ...)' -- one line, no quoted input."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None)
    return f"not valid YAML{where}" + (f" ({' '.join(str(problem).split())})" if problem else "")
