"""Replace personal data (e-mail addresses, phone numbers, public IPv4 addresses, credit-card
numbers) with placeholders. Private and reserved IPv4 addresses (RFC 1918, loopback, link-local,
documentation, multicast) identify no one and are kept unless `ipv4_keep_private` is off.

Most documents hold none of these, so every kind has a cheap precheck that rules it out
before its regex runs: no '@' means no e-mail; the digit "shape" of the text (each ASCII digit
mapped to '0' by one bytes.translate) must contain "0.0" for an IPv4 address, 13 digits for a
card, "000-000-0000" (or with dots or spaces) for a North-American number, and so on. The
card and IPv4 regexes start with a digit and only then look behind, which lets the regex engine
jump from digit to digit instead of trying every position.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from pydantic import Field

from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseTransform
from lmforge.dataprep.step_registry import StepSettings


class PIIConfig(StepSettings):
    emails: bool = True
    phones: bool = True
    ipv4: bool = True
    ipv4_keep_private: bool = Field(
        True, description="leave IPv4 addresses that identify no one (RFC 1918 private, loopback, link-local, "
        "documentation, multicast, reserved: `192.168.0.1` in a router manual); public ones are still replaced")
    credit_cards: bool = True
    email_placeholder: str = "<EMAIL>"
    phone_placeholder: str = "<PHONE>"
    ipv4_placeholder: str = "<IP_ADDRESS>"
    credit_card_placeholder: str = "<CREDIT_CARD>"


_DIGIT_SHAPE = bytes.maketrans(b"0123456789", b"0000000000")

# local part (possessive: no backtracking into it), '@', dot-separated domain labels, a letters-only TLD
_EMAIL = re.compile(
    r"(?<![\w.%+\-])[\w.%+\-]++@[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b"
)

# 13-19 digits, single spaces or dashes allowed between them; not part of a longer such run,
# a decimal or a word. Validity (Luhn) is checked on each match.
_CARD = re.compile(r"[0-9](?<![\w.+\-][0-9])(?<![0-9][ \-][0-9])(?:[ \-]?[0-9]){12,18}(?![ \-]?[0-9]|\.[0-9]|\w)")

# four dot-separated groups of 1-3 digits; each group is checked to be 0-255 on the match
_IPV4 = re.compile(r"[0-9](?<![\w.][0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?!\.?[0-9]|\w)")

# +CC then 7-14 more digits, single separators or parentheses between them: +44 20 7946 0958,
# +1 (555) 123-4567, +14155552671
_PHONE_INTERNATIONAL = re.compile(
    r"\+(?<![\w+]\+)[0-9](?:(?:[ .\-]?\(|\)[ .\-]?|[ .\-])?[0-9]){7,14}(?![ .\-]?[0-9]|\w)"
)
# North American: (555) 123-4567, (555)123-4567
_PHONE_AREA_IN_PARENS = re.compile(r"\((?<![\w+.\-/]\()[0-9]{3}\)[ .\-]?[0-9]{3}[ .\-][0-9]{4}(?![.\-]?[0-9]|\w)")
# North American: 555-123-4567, 555.123.4567, 555 123 4567, 1-800-555-1234 (the same separator
# between the three groups)
_PHONE_SEPARATED = re.compile(
    r"(?<![\w+.\-/])(?:1[ .\-])?[0-9]{3}([ .\-])[0-9]{3}\1[0-9]{4}(?![.\-]?[0-9]|\w)"
)
_SEPARATED_PHONE_SHAPES = (b"000-000-0000", b"000.000.0000", b"000 000 0000")


def luhn_valid(digits: str) -> bool:
    """Whether a string of ASCII digits passes the Luhn checksum."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _valid_ipv4(address: str) -> bool:
    """Every octet 0-255, without leading zeros."""
    return all(int(octet) <= 255 and (octet == "0" or octet[0] != "0") for octet in address.split("."))


def _public_ipv4(address: str) -> bool:
    """An address that can point at someone's machine: globally routable, not multicast."""
    ip = ipaddress.IPv4Address(address)
    return ip.is_global and not ip.is_multicast


class PIIScrubber(BaseTransform):
    """Replaces e-mail addresses, phone numbers, IPv4 addresses and Luhn-valid credit-card
    numbers with the configured placeholders.

    Counters: one per kind (`email`, `phone`, `ipv4`, `credit_card`: replacements),
    `docs_with_pii` (documents changed) and `ipv4_kept_private` (private and reserved
    addresses left as they are). A changed document gets `metadata["pii"]`, the per-kind
    counts that are not zero.
    """

    type_name = "pii"
    Settings = PIIConfig

    def __init__(self, config: PIIConfig | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.config = config or PIIConfig()

    def transform(self, doc: Document) -> Document:
        cfg = self.config
        text = doc.text
        found: dict[str, int] = {}

        if cfg.emails and "@" in text:
            text, found["email"] = _EMAIL.subn(cfg.email_placeholder, text)

        shape = text.encode("utf-8").translate(_DIGIT_SHAPE)
        n_digits = shape.count(b"0")
        if cfg.credit_cards and n_digits >= 13:
            text, found["credit_card"] = _replace_valid(_CARD, text, cfg.credit_card_placeholder, _is_card_number)
        if cfg.ipv4 and n_digits >= 4 and b"0.0" in shape:
            text, found["ipv4"] = self._replace_ipv4(text)
        if cfg.phones and n_digits >= 8:
            text, found["phone"] = self._replace_phones(text, shape, n_digits)

        counts = {kind: count for kind, count in found.items() if count}
        if counts:
            doc.text = text
            doc.metadata["pii"] = counts
            self.stats.counters.update(counts)
            self.stats.counters["docs_with_pii"] += 1
        return doc

    def _replace_ipv4(self, text: str) -> tuple[str, int]:
        placeholder, keep_private = self.config.ipv4_placeholder, self.config.ipv4_keep_private
        replaced = kept = 0

        def replace(match: re.Match) -> str:
            nonlocal replaced, kept
            address = match.group()
            if not _valid_ipv4(address):
                return address
            if keep_private and not _public_ipv4(address):
                kept += 1
                return address
            replaced += 1
            return placeholder

        text = _IPV4.sub(replace, text)
        if kept:
            self.stats.counters["ipv4_kept_private"] += kept
        return text, replaced

    def _replace_phones(self, text: str, shape: bytes, n_digits: int) -> tuple[str, int]:
        placeholder = self.config.phone_placeholder
        total = 0
        if "+" in text:
            text, count = _PHONE_INTERNATIONAL.subn(placeholder, text)
            total += count
        if n_digits >= 10:
            if "(" in text:
                text, count = _PHONE_AREA_IN_PARENS.subn(placeholder, text)
                total += count
            if any(phone_shape in shape for phone_shape in _SEPARATED_PHONE_SHAPES):
                text, count = _PHONE_SEPARATED.subn(placeholder, text)
                total += count
        return text, total


def _is_card_number(candidate: str) -> bool:
    return luhn_valid(candidate.replace(" ", "").replace("-", ""))


def _replace_valid(pattern: re.Pattern, text: str, placeholder: str, valid: Callable[[str], bool]) -> tuple[str, int]:
    """Replace the matches that `valid` accepts; the others stay as they are."""
    replaced = 0

    def replace(match: re.Match) -> str:
        nonlocal replaced
        if valid(match.group()):
            replaced += 1
            return placeholder
        return match.group()

    return pattern.sub(replace, text), replaced
