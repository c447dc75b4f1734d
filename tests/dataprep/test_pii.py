"""PII scrubbing: each kind is replaced, look-alikes (Luhn-invalid numbers, dates, years,
versions, decimals) are left alone, and the counters say what was replaced."""

from __future__ import annotations

import pytest

from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.pii import PIIConfig, PIIScrubber, luhn_valid


def scrub(text: str, **config) -> Document:
    return PIIScrubber(PIIConfig(**config)).transform(Document(0, "https://example.com/", text))


@pytest.mark.parametrize(
    "address",
    ["jane.doe@example.com", "j_smith+news@mail.example.co.uk", "info@my-shop.org", "A.B-C%x@sub.domain.travel"],
)
def test_email_addresses_are_replaced(address):
    doc = scrub(f"Write to {address}, we answer quickly.")
    assert doc.text == "Write to <EMAIL>, we answer quickly."
    assert doc.metadata["pii"] == {"email": 1}


@pytest.mark.parametrize("text", ["Follow @lmforge today.", "Price: 5 @ $3 each.", "user@localhost is local."])
def test_at_signs_that_are_not_addresses_stay(text):
    doc = scrub(text)
    assert doc.text == text and "pii" not in doc.metadata


@pytest.mark.parametrize(
    "number",
    [
        "(555) 123-4567",
        "(555)123-4567",
        "555-123-4567",
        "555.123.4567",
        "555 123 4567",
        "1-800-555-1234",
        "+44 20 7946 0958",
        "+1 (555) 123-4567",
        "+1 555 123 4567",
        "+14155552671",
        "+49 30 1234567",
        "+33 1 42 68 53 00",
    ],
)
def test_phone_numbers_are_replaced(number):
    doc = scrub(f"Call {number} today.")
    assert doc.text == "Call <PHONE> today."
    assert doc.metadata["pii"] == {"phone": 1}


PUBLIC_IPV4 = ["8.8.8.8", "93.184.216.34", "1.1.1.1", "172.32.0.1", "11.0.0.1", "192.169.0.1"]
# RFC 1918, loopback, link-local, "this network", documentation (TEST-NET), multicast, reserved/netmask,
# shared address space (RFC 6598)
NON_PUBLIC_IPV4 = ["192.168.0.1", "10.0.0.255", "172.16.5.4", "172.31.255.254", "127.0.0.1", "169.254.10.20",
                   "0.0.0.0", "192.0.2.44", "198.51.100.7", "224.0.0.251", "255.255.255.0", "255.255.255.255",
                   "100.64.0.1"]


@pytest.mark.parametrize("address", PUBLIC_IPV4)
def test_public_ipv4_addresses_are_replaced(address):
    doc = scrub(f"The request came from {address}.")
    assert doc.text == "The request came from <IP_ADDRESS>."
    assert doc.metadata["pii"] == {"ipv4": 1}


@pytest.mark.parametrize("address", NON_PUBLIC_IPV4)
def test_private_and_reserved_ipv4_addresses_are_kept_unless_configured(address):
    text = f"Set the router to {address} and reboot."
    step = PIIScrubber(PIIConfig())
    doc = step.transform(Document(0, "https://example.com/", text))
    assert doc.text == text and "pii" not in doc.metadata
    assert step.stats.counters == {"ipv4_kept_private": 1}
    doc = scrub(text, ipv4_keep_private=False)
    assert doc.text == "Set the router to <IP_ADDRESS> and reboot."
    assert doc.metadata["pii"] == {"ipv4": 1}


def test_a_router_manual_keeps_its_addresses_and_loses_the_public_one():
    text = ("Open http://192.168.1.1/ (or 10.0.0.138 on older models), set the mask to 255.255.255.0 and "
            "the DNS server to 8.8.8.8; the log shows the last login from 81.2.69.160.")
    doc = scrub(text)
    assert doc.text == text.replace("8.8.8.8", "<IP_ADDRESS>").replace("81.2.69.160", "<IP_ADDRESS>")
    assert doc.metadata["pii"] == {"ipv4": 2}


@pytest.mark.parametrize(
    "number",
    ["4111 1111 1111 1111", "4111-1111-1111-1111", "4111111111111111", "5500 0000 0000 0004", "3782 822463 10005",
     "378282246310005", "6011000990139424"],
)
def test_luhn_valid_card_numbers_are_replaced(number):
    assert luhn_valid(number.replace(" ", "").replace("-", ""))
    doc = scrub(f"Paid with {number} yesterday.")
    assert doc.text == "Paid with <CREDIT_CARD> yesterday."
    assert doc.metadata["pii"] == {"credit_card": 1}


@pytest.mark.parametrize("number", ["4111 1111 1111 1112", "4111-1111-1111-1112", "1234567812345678"])
def test_luhn_invalid_card_numbers_are_kept(number):
    assert not luhn_valid(number.replace(" ", "").replace("-", ""))
    text = f"Order reference {number} was shipped."
    doc = scrub(text)
    assert doc.text == text
    assert "pii" not in doc.metadata


def test_luhn():
    assert luhn_valid("79927398713")
    assert not luhn_valid("79927398710")
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")


LOOK_ALIKES = [
    "The treaty was signed in 1999 and revised in 2023.",
    "Deadline: 2024-01-15, or 15/01/2024, or 01.02.2024 at 12:30.",
    "Upgrade to Python 3.11.7 or v2.10.1; version 1.2.3 is obsolete.",
    "Pi is about 3.14159265358979 and the low was -40.5 degrees.",
    "It costs $1,299.99 and weighs 12.5 kg; 1,000,000 people came.",
    "Not addresses: 999.1.1.1, 256.1.1.1, 1.2.3.4.5 and 192.168.001.1.",
    "Scores were 100 200 and 300; room 42; code 12345; years 1990-2000.",
    "The ISBN 978-0-306-40615-7 and the ratio 16:9 stay.",
    "A long id 12345678901234567890123 is not a card.",
    "The counter read +123456789012345678 after the overflow.",
    "Lottery numbers +1 234 567 890 123 456 789 came up.",
    "Serial 4111 1111 1111 1111 2222 is too long for a card.",
    "The value 4111111111111111.5 is a decimal.",
]


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_numbers_that_are_not_pii_are_untouched(text):
    doc = scrub(text)
    assert doc.text == text
    assert "pii" not in doc.metadata


def test_counters_and_metadata_per_document():
    step = PIIScrubber()
    texts = [
        "Mail a@example.com or b@example.org, call 555-123-4567, card 4111 1111 1111 1111.",
        "Nothing personal here, just the year 2024.",
        "Server 93.184.216.34 and 93.184.216.35 answered, not 10.1.2.3; bad card 4111 1111 1111 1112.",
    ]
    docs = list(step.run(Document(i, "", text) for i, text in enumerate(texts)))
    assert docs[0].text == "Mail <EMAIL> or <EMAIL>, call <PHONE>, card <CREDIT_CARD>."
    assert docs[0].metadata["pii"] == {"email": 2, "phone": 1, "credit_card": 1}
    assert docs[1].text == texts[1] and "pii" not in docs[1].metadata
    assert docs[2].metadata["pii"] == {"ipv4": 2}
    assert "4111 1111 1111 1112" in docs[2].text and "10.1.2.3" in docs[2].text
    counters = step.stats.counters
    assert counters == {"email": 2, "phone": 1, "credit_card": 1, "ipv4": 2, "docs_with_pii": 2,
                        "ipv4_kept_private": 1}
    assert step.stats.docs_in == step.stats.docs_out == 3
    assert step.stats.bytes_out == sum(len(doc.text.encode()) for doc in docs)


def test_kinds_can_be_switched_off_and_placeholders_changed():
    text = "Mail a@example.com, call 555-123-4567, host 93.184.216.34, card 4111 1111 1111 1111."
    doc = scrub(text, emails=False, ipv4=False)
    assert doc.text == "Mail a@example.com, call <PHONE>, host 93.184.216.34, card <CREDIT_CARD>."
    doc = scrub(text, phones=False, credit_cards=False, email_placeholder="[mail]", ipv4_placeholder="[ip]")
    assert doc.text == "Mail [mail], call 555-123-4567, host [ip], card 4111 1111 1111 1111."


def test_a_disabled_step_is_left_out_of_the_pipeline():
    from lmforge.dataprep.config import DataprepConfig
    from lmforge.dataprep.worker import build_filter_steps

    config = DataprepConfig.model_validate({"steps": {"pii": {"enabled": False}}})
    names = [step.name for step in build_filter_steps(config)]
    assert names == ["url_dedup", "exact_dedup", "url_filter", "langid", "gopher_repetition", "gopher_quality",
                     "c4_quality", "fineweb_quality"]


def test_non_ascii_text_around_pii():
    doc = scrub("Écrivez à léa@example.fr — ou appelez le +33 1 42 68 53 00 « vite ».")
    assert doc.text == "Écrivez à <EMAIL> — ou appelez le <PHONE> « vite »."
    assert doc.metadata["pii"] == {"email": 1, "phone": 1}
