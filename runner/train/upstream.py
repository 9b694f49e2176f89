"""What a custom rule names of upstream (its `upstream=` in `runner.train.custom_rule.custom_rule`), and the
records of it in summary.json's `custom_upstream`: the package whose functions it calls (with the version that
ran), the repository and commit a paraphrase was read at, the paper an objective is written out from, and the
tests of this repository that hold it against upstream, with their kind of evidence. The analysis derives the
kinds of evidence behind a run from these records (`analysis.load.provenance`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata

from runner.config import Evidence


@dataclass(frozen=True)
class Package:
    """An installed package whose functions the rule calls (`calls`) and whose code it otherwise follows."""

    name: str  # the distribution, as pip names it
    calls: tuple[str, ...] = ()  # the functions called, by their import path
    follows: tuple[str, ...] = ()  # FILE: FUNCTION of the package that the rule writes out (not callable alone)

    def record(self) -> dict:
        try:
            version = metadata.version(self.name)
        except metadata.PackageNotFoundError:
            version = None
        return {"package": self.name, "version": version, "calls": list(self.calls), "follows": list(self.follows)}


@dataclass(frozen=True)
class Source:
    """Upstream code the rule paraphrases (not packaged, or not callable alone): repository, commit, files."""

    repository: str  # owner/name on GitHub
    commit: str  # the commit the paraphrase was read at
    files: tuple[str, ...] = field(default_factory=tuple)  # FILE: FUNCTION, as read there

    def record(self) -> dict:
        return {"repository": self.repository, "commit": self.commit, "files": list(self.files)}


@dataclass(frozen=True)
class Paper:
    """A published objective the rule writes out (there is no code to call or read): the paper and where in it."""

    citation: str  # authors, year, title
    where: str  # its arXiv id and the equation

    def record(self) -> dict:
        return {"paper": self.citation, "where": self.where}


TESTED_KINDS = (Evidence.release.value, Evidence.upstream_tests.value, Evidence.issue_example.value)


@dataclass(frozen=True)
class Tested:
    """A test of this repository that holds the rule, or the part of it named in `via`, against upstream: the
    kind of evidence (`runner.config.Evidence`: a release's own code run beside it, upstream's own test cases
    reproduced, or an upstream report's own example), the test, and what it is compared with."""

    __test__ = False  # no pytest test class, whatever its name

    evidence: str  # one of TESTED_KINDS
    test: str  # "tests/test_x.py::test_name", or "tests/test_x.py" for every test of the file
    against: str  # the upstream it is compared with: the release, or the repository@commit of the tests
    via: tuple[str, ...] = ()  # the functions of the rule's module the test calls in its stead (() = the rule)
    needs: str | None = None  # what the test is skipped without (a package `make test` lacks, the package index)

    def __post_init__(self):
        if self.evidence not in TESTED_KINDS:
            raise ValueError(
                f"Tested evidence {self.evidence!r}: a test of this repository gives one of {TESTED_KINDS}"
            )
        if not self.test.startswith("tests/") or ".py" not in self.test:
            raise ValueError(f"Tested test {self.test!r}: name it as tests/FILE.py or tests/FILE.py::test_name")

    def record(self) -> dict:
        return {
            "evidence": self.evidence,
            "test": self.test,
            "against": self.against,
            "via": list(self.via),
            "needs": self.needs,
        }


def upstream_records(fn) -> list[dict]:
    """summary.json's `custom_upstream`: each package (with the version that ran), source, paper and test the rule
    names."""
    return [entry.record() for entry in getattr(fn, "upstream", ()) or ()]
