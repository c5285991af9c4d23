"""`make chart-lint`'s checkov justifications: read from docs/security.md's table only, and a
finding without a justification or a justification that went stale fails the run."""

from __future__ import annotations

import pytest

from dataplane.chartlint import (
    JUSTIFIED,
    LintFailed,
    checkov_failures,
    justified_checks,
)

DOC = """# Security

| check | elsewhere |
|---|---|
| `CKV_K8S_99` | a table of another section does not count |

## The chart

### Accepted checkov findings

| check | what | why |
|---|---|---|
| `CKV_K8S_11` | a CPU limit | reason |
| `CKV2_K8S_6` | a NetworkPolicy | reason |

### Dockerfile

| `CKV_K8S_98` | after the section: does not count |
"""


def test_the_justified_checks_come_from_the_section_of_docs_security_md() -> None:
    assert justified_checks(DOC) == {"CKV_K8S_11", "CKV2_K8S_6"}
    assert JUSTIFIED.name == "security.md"
    # the real document: the checks the chart accepts today
    assert justified_checks(JUSTIFIED.read_text()) == {
        "CKV_K8S_11",
        "CKV_K8S_15",
        "CKV_K8S_38",
        "CKV_K8S_43",
    }


def test_a_document_without_the_section_is_an_error() -> None:
    with pytest.raises(LintFailed, match="no section"):
        justified_checks(DOC.replace("Accepted checkov findings", "Findings"))


def test_an_unjustified_finding_and_a_stale_justification_both_fail() -> None:
    justified = justified_checks(DOC)
    assert checkov_failures({"CKV_K8S_11", "CKV2_K8S_6"}, justified) == []
    unjustified = checkov_failures({"CKV_K8S_11", "CKV2_K8S_6", "CKV_K8S_20"}, justified)
    assert len(unjustified) == 1 and "not justified" in unjustified[0]
    assert "CKV_K8S_20" in unjustified[0]
    stale = checkov_failures({"CKV_K8S_11"}, justified)
    assert len(stale) == 1 and "pass now" in stale[0] and "CKV2_K8S_6" in stale[0]
