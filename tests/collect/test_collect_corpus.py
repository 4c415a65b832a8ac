"""The bundle of a node with every secret shape of the corpus planted (tests/fixtures/secrets/positive) holds none
of them (issue 45): the shapes in the engine's log, a CANN plog and a vllm-ascend log; the learned ones in the
instance's env file and a kept revision's launch.json, and each learned value again as a bare word in the logs,
where only learning can find it. The negatives, planted in a log of their own, come out whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

from npuops.support.bundle import Bundle
from tests.collect.test_collect_hostile import Node, everything
from tests.collect.test_redact_corpus import NEGATIVES, POSITIVES, Sample, read_sample


def _pieces(secret: str) -> list[str]:
    """The secret and each of its words that holds a digit (a value masked to its first word only is a leak)."""
    return [secret, *(w for w in re.findall(r"\w*\d\w*", secret) if len(w) >= 3 and w != secret)]


def _plant(node: Node, samples: list[Sample]) -> None:
    status_dir = node.instance()
    shapes = [s for s in samples if not s.learn]
    # A private key's BEGIN without its END masks to the end of what is read: last, so it hides nothing else.
    shapes.sort(key=lambda s: "BEGIN" in s.text and "END" not in s.text)
    env = [s for s in samples if s.learn == "env"]
    records = [s for s in samples if s.learn == "json"]
    (node.state / "demo" / "env").write_text("".join(s.text for s in env))
    revision = node.state / "demo" / "revisions" / "1"
    revision.mkdir(parents=True)
    for number, sample in enumerate(records):
        (revision / f"launch{number}.json" if number else revision / "launch.json").write_text(sample.text)
    learned_words = "".join(f"INFO the engine logged {secret} in passing\n"
                            for s in [*env, *records] for secret in s.secrets)
    shape_text = "\n".join(s.text for s in shapes)
    (status_dir / "engine.log").write_text(learned_words + shape_text)
    plog = node.root / "root/ascend/log/debug/plog"
    plog.mkdir(parents=True)
    (plog / "plog-1_1.log").write_text(shape_text + "\n" + learned_words)
    vllm_ascend = node.root / "root/ascend/log/vllm_ascend"
    vllm_ascend.mkdir(parents=True)
    (vllm_ascend / "negatives.log").write_text("\n".join(read_sample(p).text for p in NEGATIVES))


def _leaks(bundle: Bundle, samples: list[Sample]) -> list[tuple[str, str]]:
    blob = everything(bundle).decode("utf-8", "replace")
    return [(s.path.stem, piece) for s in samples for secret in s.secrets for piece in _pieces(secret)
            if piece in blob]


def test_a_bundle_of_a_node_with_every_shape_planted_holds_none_of_them(tmp_path: Path) -> None:
    node = Node(tmp_path)
    samples = [read_sample(p) for p in POSITIVES]
    _plant(node, samples)
    bundle = node.collect("demo")
    paths = {f.path for f in bundle.files}
    assert {"instances/demo/engine.log", "instances/demo/files/env",
            "ascend-logs/root/debug/plog/plog-1_1.log"} <= paths, sorted(paths)
    assert not _leaks(bundle, samples)
    negatives = bundle.data("ascend-logs/root/vllm_ascend/negatives.log").decode()
    for path in NEGATIVES:
        assert read_sample(path).text in negatives, path.stem
    # The bundle says what it learned and masked: the manifest's files carry their sha256, nothing of a secret.
    assert not _leaks_in(json.dumps(bundle.manifest()), samples)


def _leaks_in(text: str, samples: list[Sample]) -> list[str]:
    return [secret for s in samples for secret in s.secrets if secret in text]
