"""Small helpers to coerce and check config values; the schema itself lives in stacks/config.py."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

TRUE_WORDS = ("true", "yes", "1", "on")
FALSE_WORDS = ("false", "no", "0", "off")


class StackError(ValueError):
    """The root of what stops a synth or a deploy before AWS is asked: app.py catches this one class."""


class StackConfigError(StackError):
    """A bad cdk.json value; the message names the key, the value and what is allowed."""

    @classmethod
    def bad_value(cls, key: str, value: Any, allowed: str) -> StackConfigError:
        return cls(
            f"config key '{key}' has value {value!r}; allowed: {allowed}. "
            f"Fix it in cdk.json (context) or pass -c {key}=<value>."
        )

    @classmethod
    def unknown_key(cls, key: str, known: Iterable[str]) -> StackConfigError:
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return cls(f"unknown config key '{key}'{hint}; known keys: {', '.join(sorted(known))}.")


def describe(text: str) -> dict[str, str]:
    """A config field's metadata: the words the docs' tables and the errors show for it."""
    return {"description": text}


def json_context(key: str, raw: Any, hint: str = "") -> Any:
    """A context value given as JSON text (``-c key='[...]'``) decoded; any other value as it is."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise StackConfigError(
            f"config key '{key}' is not valid JSON ({error.msg} at column {error.colno}){hint}"
        ) from None


def entry_where(index: int, item: Any) -> str:
    """How errors name one entry of a context list: its index, and its name when it has one."""
    name = item.get("name") if isinstance(item, dict) else None
    return f"[{index}]" + (f" ({name})" if isinstance(name, str) and name else "")


@dataclass(frozen=True)
class Rule:
    """A check on one value and the words that tell the user what is allowed."""

    check: Callable[[Any], bool]
    allowed: str

    def apply(self, key: str, value: Any) -> None:
        if not self.check(value):
            raise StackConfigError.bad_value(key, value, self.allowed)


def one_of(*choices: Any) -> Rule:
    return Rule(lambda value: value in choices, "one of " + ", ".join(str(c) for c in choices))


def int_range(low: int, high: int, extra: str = "") -> Rule:
    return Rule(lambda value: low <= value <= high, f"an integer from {low} to {high}{extra}")


def matches(pattern: str, description: str) -> Rule:
    # ASCII: Python's \d also matches other scripts' digits (Arabic-Indic, Devanagari, ...), which no AWS id has.
    compiled = re.compile(pattern, re.ASCII)
    return Rule(lambda value: bool(compiled.fullmatch(value)), description)


# RFC 1918's private address blocks: what a VPC may use for its own addresses. Python's is_private is wider
# (it also calls link-local 169.254/16, loopback 127/8 and "this network" 0/8 private), and a VPC there breaks:
# 169.254 holds the instance metadata service and the Amazon DNS resolver, 127/8 is each host's loopback.
RFC1918 = tuple(ipaddress.IPv4Network(block) for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def ipv4_cidr(min_prefix: int, max_prefix: int) -> Rule:
    def check(value: str) -> bool:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError:
            return False
        inside = any(network.subnet_of(block) for block in RFC1918)
        return value.isascii() and inside and min_prefix <= network.prefixlen <= max_prefix

    return Rule(
        check,
        f"a private IPv4 network in CIDR form inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16 (RFC 1918) with "
        f"a prefix from /{min_prefix} to /{max_prefix}, e.g. 10.0.0.0/16",
    )


def coerce(key: str, raw: Any, default: Any) -> Any:
    """Turn a context value into the type of the field's default (``-c`` values are strings)."""
    if isinstance(default, bool):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return raw.strip().lower() in TRUE_WORDS
        raise StackConfigError.bad_value(key, raw, "true or false")
    if isinstance(default, int):
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and re.fullmatch(r"\s*-?[0-9]+\s*", raw):
            return int(raw)
        raise StackConfigError.bad_value(key, raw, "an integer")
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw)  # e.g. an account id written as a JSON number
    raise StackConfigError.bad_value(key, raw, "a string")
