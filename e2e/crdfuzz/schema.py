"""Hypothesis strategies for nodewarden objects, derived from the CRD schemas in `crds/`.

`spec_strategy(kind, hostile=...)` draws a spec for one kind. The structure follows the
schema (which optional fields are present, how many entries a list or map has); each leaf
is drawn from a pool made once per schema node, biased towards its edges: the longest
string allowed, the largest and smallest number, the maximum duration, a map with the
most entries, text with odd Unicode (right-to-left overrides, combining marks, emoji,
NUL, shell metacharacters) where the schema admits any text, plus values drawn at random
within the bounds. With `hostile=True` a leaf is sometimes a value the schema does not
admit: one character or one unit past a bound, a negative or a wrong type, a duration
that overflows Go and Python, a deeply nested map where a scalar belongs. CEL rules are
not modelled: the API server or the models reject what breaks them, which is part of
what is tested. Pools (one draw per leaf) keep it fast: thousands of examples in seconds.
"""

from __future__ import annotations

import functools
import json
import random
import re
import string
from collections.abc import Callable, Mapping
from pathlib import Path
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import yaml
from hypothesis import strategies as st

from nodewarden.api.base import DNS_SUBDOMAIN_PATTERN

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"

ODD_TEXT = [
    "\u202eevil\u202c",  # right-to-left override
    "e\u0301\u0301\u0301",  # combining marks
    "\U0001f525" * 8,  # emoji (4-byte UTF-8)
    "nul\x00byte",
    "line\nbreak\r\n",
    "\ufeffbom",
    "${HOME}$(id)`id`;|&",  # shell metacharacters (the runner quotes, never evaluates)
    "\\u0000\\\\",
    "%s%n%x",
    "' OR 1=1 --",
    "\u03a9\u2248\u00e7\u221a\u222b\u02dc\u00b5\u2264\u2265\u00f7",  # lookalike symbols
    "\u0000",
]
OVERFLOWING_DURATIONS = ["99999999999h", "100000000h", "8761h", "9" * 40 + "ns", "1h" * 7]
KEY_RULE = re.compile(r'k\.matches\("((?:[^"\\]|\\.)*)"\)')
DOCUMENT_BYTES = 200_000
"""A list at its maxItems edge repeats one item up to about this size (the API server
takes objects up to 1.5 MiB)."""
POOL = 24
"""Random values per leaf pool, besides its edges."""
_SIMPLE = re.compile(r"^\^\[([^\]]+)\](?:\[([^\]]+)\])?([*+])\$$")
_GROUPS = {"h": 2920, "m": 59, "s": 59, "ms": 999, "us": 999, "ns": 999}


@functools.cache
def kind_schemas() -> dict[str, dict[str, Any]]:
    """kind -> its openAPIV3Schema (the generated CRDs, as the API server has them)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def spec_schema(kind: str) -> dict[str, Any]:
    return kind_schemas()[kind]["properties"]["spec"]  # type: ignore[no-any-return]


def deep(depth: int) -> Any:
    doc: Any = "bottom"
    for i in range(depth):
        doc = {f"k{i}": doc, "list": [doc] if i % 10 == 0 else []}
    return doc


def _class(spec: str) -> str:
    """The characters of a regex character class body such as `-._a-zA-Z0-9`."""
    out, i = [], 0
    while i < len(spec):
        if spec[i] == "\\" and i + 1 < len(spec):
            out.append(spec[i + 1])
            i += 2
        elif i + 2 < len(spec) and spec[i + 1] == "-":
            out.extend(chr(c) for c in range(ord(spec[i]), ord(spec[i + 2]) + 1))
            i += 3
        else:
            out.append(spec[i])
            i += 1
    return "".join(out)


def _dns(rnd: random.Random) -> str:
    labels = [
        "".join(rnd.choices(string.ascii_lowercase + string.digits, k=rnd.randint(1, 12)))
        for _ in range(rnd.randint(1, 4))
    ]
    return ".".join(labels)


def _duration(rnd: random.Random) -> str:
    units = rnd.sample(sorted(_GROUPS), rnd.randint(1, 3))
    return "".join(f"{rnd.randint(0, _GROUPS[u])}{u}" for u in units)


_ANY = string.ascii_letters + string.digits + "-._~:/?#@!$&'()*+,;=% "
_CATEGORIES = {
    sre.CATEGORY_DIGIT: string.digits,
    sre.CATEGORY_SPACE: " \t",
    sre.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
}


def _chars(items: list[Any]) -> str:
    """The characters an IN node (a character class) admits, from a small universe."""
    negate = any(op is sre.NEGATE for op, _ in items)
    admitted: set[str] = set()
    for op, arg in items:
        if op is sre.LITERAL:
            admitted.add(chr(arg))
        elif op is sre.RANGE:
            admitted.update(chr(c) for c in range(arg[0], arg[1] + 1))
        elif op is sre.CATEGORY:
            admitted.update(_CATEGORIES.get(arg, ""))
    if negate:
        return "".join(c for c in _ANY if c not in admitted)
    return "".join(sorted(admitted))


def _emit(nodes: Any, rnd: random.Random, out: list[str]) -> None:
    for op, arg in nodes:
        if op is sre.LITERAL:
            out.append(chr(arg))
        elif op is sre.NOT_LITERAL:
            out.append(rnd.choice([c for c in _ANY if c != chr(arg)]))
        elif op is sre.ANY:
            out.append(rnd.choice(_ANY))
        elif op is sre.IN:
            out.append(rnd.choice(_chars(arg)))
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, sub = arg
            for _ in range(rnd.randint(low, min(high, low + 8))):
                _emit(sub, rnd, out)
        elif op is sre.SUBPATTERN:
            _emit(arg[-1], rnd, out)
        elif op is sre.BRANCH:
            _emit(rnd.choice(arg[1]), rnd, out)
        # AT (anchors) emit nothing


def _generator(pattern: str) -> Callable[[random.Random], str] | None:
    """A fast random generator of strings matching `pattern` (from its parsed form; the
    caller keeps only what `re.fullmatch` confirms)."""
    if pattern == DNS_SUBDOMAIN_PATTERN:
        return _dns
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None

    def draw(rnd: random.Random) -> str:
        out: list[str] = []
        _emit(parsed, rnd, out)
        return "".join(out)

    return draw


def _string_pool(schema: Mapping[str, Any], rnd: random.Random) -> tuple[list[str], bool]:
    """Admitted strings for `schema`, and whether hypothesis must add from_regex draws."""
    longest = int(schema.get("maxLength", 64))
    shortest = int(schema.get("minLength", 0))
    pattern = schema.get("pattern")
    rules = json.dumps(schema.get("x-kubernetes-validations", []))
    if schema.get("format") == "date-time":
        return [
            "1970-01-02T00:00:00Z",
            "9999-12-30T23:59:59Z",
            "2026-12-01T10:00:00.123456Z",
        ], False
    if "duration(" in rules:
        maximum = re.search(r"duration\('([^']+)'\)", rules)
        edges = [maximum.group(1)] if maximum else []
        return [*edges, "0s", "1ns", "1.5h", *(_duration(rnd) for _ in range(POOL))], False
    if pattern:
        generate = _generator(pattern)
        if generate is None:
            return [], True
        drawn = [generate(rnd) for _ in range(POOL * 4)]
        if pattern == DNS_SUBDOMAIN_PATTERN:
            drawn += ["a" * longest, "0", "a-b.c-d"]
        kept = [s for s in drawn if shortest <= len(s) <= longest and re.fullmatch(pattern, s)]
        return kept[: POOL + 3], not kept
    edges = ["x" * max(shortest, 1) if shortest else "", "y" * longest]
    edges.append(("\U0001f525" * longest)[: max(shortest, longest // 4)])  # long, 4-byte chars
    odd = [t[:longest] for t in ODD_TEXT if len(t) >= shortest]
    alphabet = string.printable + "äöüßéñ中文日本語\u200b\u2028"
    drawn = [
        "".join(rnd.choices(alphabet, k=rnd.randint(shortest, min(longest, 40))))
        for _ in range(POOL)
    ]
    return [*edges, *odd, *drawn], False


def _number_pool(schema: Mapping[str, Any], rnd: random.Random, integer: bool) -> list[Any]:
    low = schema.get("minimum", -(2**31))
    high = schema.get("maximum", 2**31)
    pool: list[Any] = [low, high] + ([0] if low <= 0 <= high else [])
    for _ in range(POOL):
        pool.append(rnd.randint(int(low), int(high)) if integer else rnd.uniform(low, high))
    if not integer:
        pool.append(float(high) - 1e-9 if high > low else float(high))
    return pool


def _outside(schema: Mapping[str, Any]) -> list[Any]:
    """Values one step outside `schema` (what the API server must refuse)."""
    kind = schema.get("type")
    out: list[Any] = [None, {"deep": deep(60)}, [], True, -1, 1e308]
    if kind == "string":
        out.append("x" * (int(schema.get("maxLength", 64)) + 1))
        if "duration(" in json.dumps(schema.get("x-kubernetes-validations", [])):
            out += OVERFLOWING_DURATIONS
    if kind in ("integer", "number") and "maximum" in schema:
        out += [schema["maximum"] + 1, -(2**63), 2**64]
    if kind == "array" and "maxItems" in schema:
        out.append(["x"] * (int(schema["maxItems"]) + 1))
    return out


def value(
    schema: Mapping[str, Any], *, hostile: bool, path: str = "spec"
) -> st.SearchStrategy[Any]:
    """A value for one schema node (see the module docstring)."""
    rnd = random.Random(path)  # the same pools for the same schema
    kind = schema.get("type")
    extra: list[st.SearchStrategy[Any]] = []
    if "enum" in schema:
        pool: list[Any] = list(schema["enum"])
    elif schema.get("x-kubernetes-preserve-unknown-fields"):
        pool = [{"note": "free-form"}, {"deep": deep(8)}]
    elif kind == "object":
        return _or_outside(_object(schema, hostile=hostile, path=path), schema, hostile)
    elif kind == "array":
        return _or_outside(_array(schema, hostile=hostile, path=path), schema, hostile)
    elif kind == "string":
        pool, regex = _string_pool(schema, rnd)
        if regex:
            longest, shortest = int(schema.get("maxLength", 64)), int(schema.get("minLength", 0))
            extra.append(
                st.from_regex(schema["pattern"], fullmatch=True).filter(
                    lambda s: shortest <= len(s) <= longest
                )
            )
    elif kind in ("integer", "number"):
        pool = _number_pool(schema, rnd, kind == "integer")
    elif kind == "boolean":
        pool = [True, False]
    else:
        pool = [None]
    admitted = st.one_of(st.sampled_from(pool), *extra) if pool else st.one_of(*extra)
    return _or_outside(admitted, schema, hostile)


def _or_outside(
    admitted: st.SearchStrategy[Any], schema: Mapping[str, Any], hostile: bool
) -> st.SearchStrategy[Any]:
    if not hostile:
        return admitted
    return st.one_of(admitted, admitted, admitted, st.sampled_from(_outside(schema)))


def _object(schema: Mapping[str, Any], *, hostile: bool, path: str) -> st.SearchStrategy[Any]:
    props = schema.get("properties")
    if props:
        required = set(schema.get("required", []))
        fields = {k: value(v, hostile=hostile, path=f"{path}.{k}") for k, v in props.items()}
        return st.fixed_dictionaries(
            {k: s for k, s in fields.items() if k in required},
            optional={k: s for k, s in fields.items() if k not in required},
        )
    extra = schema.get("additionalProperties")
    if not isinstance(extra, dict):
        return st.just({})
    most = int(schema.get("maxProperties", 8))
    match = KEY_RULE.search(json.dumps(schema.get("x-kubernetes-validations", [])))
    rnd = random.Random(path + "{}")
    generate = _generator(json.loads(f'"{match.group(1)}"')) if match else None
    keys = (
        [generate(rnd) for _ in range(POOL)]
        if generate
        else ["".join(rnd.choices(string.ascii_letters, k=rnd.randint(1, 12))) for _ in range(POOL)]
    )
    keys = [k for k in keys if k]
    values = value(extra, hostile=hostile, path=path + "{}")
    small = st.dictionaries(st.sampled_from(keys), values, max_size=min(most, 6))
    full = {f"K{i}": "v" for i in range(most)}
    return st.one_of(small, small, st.just(full))


def _array(schema: Mapping[str, Any], *, hostile: bool, path: str) -> st.SearchStrategy[Any]:
    most = int(schema.get("maxItems", 8))
    items = value(schema["items"], hostile=hostile, path=path + "[]")
    small = st.lists(items, max_size=min(most, 5))
    if schema["items"].get("enum"):
        return small

    def longest(item: Any) -> list[Any]:
        return [item] * min(most, max(1, DOCUMENT_BYTES // (len(json.dumps(item)) + 1)))

    return st.one_of(small, small, items.map(longest))


def spec_strategy(kind: str, *, hostile: bool) -> st.SearchStrategy[dict[str, Any]]:
    """A spec of `kind` drawn from its CRD schema."""
    return value(spec_schema(kind), hostile=hostile)  # type: ignore[return-value]


def body(kind: str, name: str, spec: Any, namespace: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "nodewarden.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": spec,
    }
