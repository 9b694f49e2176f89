"""What transformers' config class of a Hugging Face model takes and makes of a config: the launcher asks a
subprocess (`runner.sweep.hf_check`), since importing transformers' configs imports torch.

`class_facts(MODEL_TYPE)`: the class's keys (every field of its default config, its `attribute_map` aliases,
its constructor's parameters) and its default config. `effective_config(CONFIG, KEYS)`: the config transformers
builds from that dict (`CONFIG_MAPPING[model_type].from_dict`, whose `__post_init__` derives fields such as
`layer_types`), and which of KEYS act on it: removing the key changes a field of the class (a legacy key that
transformers converts, such as `rope_theta`, acts; a misspelt one is kept as an attribute that nothing reads).
`python -m runner.model.hf_class --serve` answers both, one JSON line a request on stdin
({"facts": MODEL_TYPE} or {"effective": [CONFIG, KEYS]}), one JSON line a reply on stdout ({"error": ...}
where transformers raised), until stdin closes: a launcher asking of many configs imports transformers once.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import signal
import sys


def _config_class(model_type: str):
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None


def _plain(config) -> dict:
    return json.loads(config.to_json_string(use_diff=False))


def class_facts(model_type: str) -> dict:
    import transformers

    cls = _config_class(model_type)
    if cls is None:
        return {"known": False, "transformers": transformers.__version__}
    defaults = _plain(cls())
    keys = set(defaults) | set(getattr(cls, "attribute_map", {}) or {})
    if dataclasses.is_dataclass(cls):
        keys |= {field.name for field in dataclasses.fields(cls)}
    for klass in cls.__mro__:  # the constructor's named parameters, the base config's too
        init = klass.__dict__.get("__init__")
        if init is not None:
            keys |= {
                name
                for name, p in inspect.signature(init).parameters.items()
                if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
            }
    keys.discard("self")
    return {
        "known": True,
        "class": cls.__name__,
        "transformers": transformers.__version__,
        "keys": sorted(keys),
        "attribute_map": dict(getattr(cls, "attribute_map", {}) or {}),
        "defaults": defaults,
    }


def effective_config(config: dict, keys: list[str]) -> dict:
    config = dict(config)
    cls = _config_class(config.pop("model_type"))
    built = _plain(cls.from_dict(config))
    fields = set(_plain(cls()))

    def acts(key: str) -> bool:
        without = _plain(cls.from_dict({k: v for k, v in config.items() if k != key}))
        return any(built.get(field) != without.get(field) for field in fields)

    return {"effective": built, "acting": [key for key in keys if acts(key)]}


def serve() -> None:
    """Answer requests until stdin closes (the asking process ended). Ctrl-C is the launcher's to act on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "facts" in request:
                reply = class_facts(request["facts"])
            else:
                reply = effective_config(*request["effective"])
        except Exception as error:  # what transformers raised for this config, not the server's end
            reply = {"error": f"transformers could not read it ({type(error).__name__}: {error})"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] != ["--serve"]:
        sys.exit("usage: python -m runner.model.hf_class --serve (requests on stdin, one JSON line each)")
    serve()
