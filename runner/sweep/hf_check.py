"""A Hugging Face model's config held to what transformers' config class makes of it, before launch.

The launcher never imports torch, and transformers' configs import it (about 4.5 s on 2 busy cores), so the
class is asked in a subprocess (`runner.model.hf_class --serve`, started at the first question and kept while the
launching process lives, so transformers is imported once however many configs a sweep holds): once per model
type for its keys and defaults, and once per distinct config where more is needed (a key the class does not
name; a sequence-parallel run, whose attention must be one Ulysses can wrap). The rules:

- every `model.overrides` key is one the config class takes, or one transformers converts (a legacy key such
  as `rope_theta` acts on the built config): a misspelt key, which transformers would keep as an attribute
  nothing reads, is refused with the class's nearest names;
- rotary position embeddings rotate feature pairs: a rotary model's heads are of an even size (`head_dim`,
  or the width over the heads); a model with learned or no positions (GPT-2, OPT, BLOOM) has no such rule;
- under sp > 1, what the routed attention refuses at its first call (`runner.model.hf.routed`) is refused
  here from the config: attention dropout, a sliding window shorter than the sequence, logit soft-capping.
"""

from __future__ import annotations

import difflib
import functools
import json
import select
import subprocess
import sys
import threading

from runner.layout import near_multiples
from runner.model.hf_config import HEAD_KEYS, WIDTH_KEYS, hf_config_dict

TIMEOUT_S = 300.0
ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "rotary_dim", "rotary_pct", "partial_rotary_factor")
DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "attn_dropout", "attention_probs_dropout_prob")
SOFTCAP_KEYS = ("attn_logit_softcapping",)

Problems = list[tuple[str, str]]


class _Transformers:
    """The `--serve` subprocess, one request at a time. One that died is started again at the next request;
    one left mid-request (a timeout, the launcher interrupted while it waited) is killed, so no reply is ever
    read as another request's."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def ask(self, request: dict) -> dict:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "runner.model.hf_class", "--serve"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            process, settled = self._process, False
            try:
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
                ready, _, _ = select.select([process.stdout], [], [], TIMEOUT_S)
                line = process.stdout.readline() if ready else None
                settled = bool(line)
            except (BrokenPipeError, OSError):
                line = ""
            finally:
                if not settled:
                    process.kill()
                    process.wait()
                    self._process = None
        if line is None:
            return {"error": f"asking transformers took longer than {TIMEOUT_S:g} s"}
        if not line:
            return {"error": f"transformers could not read it (its process ended with code {process.returncode})"}
        return json.loads(line)


_TRANSFORMERS = _Transformers()


@functools.cache
def class_facts(model_type: str) -> dict:
    """`runner.model.hf_class.class_facts` of a model type, from a subprocess; once per process."""
    return _TRANSFORMERS.ask({"facts": model_type})


@functools.cache
def _effective(config_json: str, keys_json: str) -> dict:
    return _TRANSFORMERS.ask({"effective": [json.loads(config_json), json.loads(keys_json)]})


def effective(config: dict, keys: list[str]) -> dict:
    """The config transformers builds from `config`, and which of `keys` act on it (once per distinct config)."""
    return _effective(json.dumps(config, sort_keys=True), json.dumps(sorted(keys)))


def _value(config: dict, defaults: dict, keys: tuple[str, ...]) -> tuple[str, object] | None:
    """(key, value) of the first of `keys` set in the config, else in the class's defaults."""
    for source in (config, defaults):
        for key in keys:
            if source.get(key) is not None:
                return key, source[key]
    return None


def hf_class_problems(cfg) -> Problems:
    """The rules above for a valid `model.arch=hf` config (its JSON rules passed: `runner.model.hf_config`)."""
    config = hf_config_dict(cfg.model)
    model_type = config["model_type"]
    facts = class_facts(model_type)
    if "error" in facts:
        return [("model.config", f"model_type={model_type}: {facts['error']}")]
    if not facts["known"]:
        return [
            (
                "model.config",
                f"model_type={model_type!r} is not an architecture of transformers {facts['transformers']} "
                "(models with remote code are not supported); give the model_type of a *ForCausalLM it has",
            )
        ]
    keys = set(facts["keys"])
    overrides = [str(key) for key in cfg.model.overrides]
    unknown = [key for key in overrides if key not in keys]
    sp = cfg.sp
    built = effective(config, unknown) if unknown or sp > 1 else {}
    if "error" in built:
        return [("model.overrides", f"model_type={model_type}: {built['error']}")]
    found = _unknown_keys(unknown, set(built.get("acting", [])), facts, model_type)
    found += _rotary_head_size(config, facts["defaults"])
    if sp > 1:
        found += _sp_features(built["effective"], sp, cfg.train.seq_len)
    return found


def _unknown_keys(unknown: list[str], acting: set[str], facts: dict, model_type: str) -> Problems:
    found = []
    for key in unknown:
        if key in acting:
            continue
        close = difflib.get_close_matches(key, facts["keys"], n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(f'model.overrides.{name}' for name in close)}?" if close else ""
        found.append(
            (
                "model.overrides",
                f"model.overrides.{key} is not a key of {facts['class']} (model_type={model_type}): transformers "
                f"would keep it and read nothing of it{hint}",
            )
        )
    return found


def _rotary_head_size(config: dict, defaults: dict) -> Problems:
    """A rotary model's heads must be of an even size (ALiBi, or learned positions, have no such rule)."""
    rotary = _value(config, defaults, ROTARY_KEYS) is not None and not _value(config, defaults, ("alibi",))
    if not rotary:
        return []
    head_dim = config.get("head_dim")
    if head_dim is not None:
        if head_dim % 2:
            return [
                (
                    "model.overrides",
                    f"model.overrides.head_dim={head_dim} must be even (rotary embeddings rotate feature pairs): "
                    f"use model.overrides.head_dim={head_dim + 1}",
                )
            ]
        return []
    heads_key, heads = _value(config, defaults, HEAD_KEYS)
    width = _value(config, {}, WIDTH_KEYS)  # a width the config gives (the class's default is another model's)
    if width and width[1] % (2 * heads):
        return [
            (
                "model.overrides",
                f"model.overrides.{width[0]}={width[1]} must split into model.overrides.{heads_key}={heads} heads of "
                f"an even size (rotary embeddings rotate feature pairs): use {width[0]}="
                f"{near_multiples(width[1], 2 * heads)}, or set model.overrides.head_dim",
            )
        ]
    return []


def _sp_features(effective_config: dict, sp: int, seq_len: int) -> Problems:
    """What Ulysses cannot wrap, read from the config transformers builds (its `layer_types` included)."""
    found = []
    dropout = _value(effective_config, {}, DROPOUT_KEYS)
    if dropout and dropout[1] > 0:
        found.append((dropout[0], f"{dropout[0]}={dropout[1]} (attention dropout)", f"{dropout[0]}=0.0"))
    window = effective_config.get("sliding_window")
    layer_types = effective_config.get("layer_types")
    sliding = window is not None and effective_config.get("use_sliding_window", True) is not False
    if sliding and layer_types is not None:
        sliding = "sliding_attention" in layer_types
    if sliding and window < seq_len:
        found.append(
            (
                "sliding_window",
                f"sliding_window={window} (shorter than train.seq_len={seq_len})",
                f"train.seq_len<={window}",
            )
        )
    softcap = _value(effective_config, {}, SOFTCAP_KEYS)
    if softcap:
        found.append((softcap[0], f"{softcap[0]}={softcap[1]} (attention logit soft-capping)", f"{softcap[0]}=null"))
    return [
        (
            "sp",
            f"sp={sp}: the model's {what} is not supported under sequence parallelism (its attention cannot be "
            f"split by Ulysses); use sp=1, or " + (fix if "seq_len" in fix else f"model.overrides.{fix}"),
        )
        for key, what, fix in found
    ]
