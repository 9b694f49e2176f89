"""Every kind of bad input is refused before any rank starts: exit status 2, a message naming the field and a valid value.

Each case goes through the steps a `python -m runner` single run takes before it starts a rank, in-process
(`tests.helpers.cli_verdict`: the override check, Hydra's composition, `admit`, the machine's shortfall), and
a few cases, one for each way the CLI comes to refuse, are real `python -m runner` launches, so that the exit
status and the message the user sees stay checked end to end. docs/command-line.md's table "Refused before
launch" lists the same kinds (checked below), so the table stays true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from runner.sweep.custom_check import check_all, forget_checked
from runner.sweep.machine import CPU_RANKS_PER_CORE, machine_problems, usable_cpu_cores
from runner.sweep.validate import EXIT_INVALID
from tests.helpers import cli_verdict, run_config, train_tokenizer

REFUSALS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"
OVERSUBSCRIBED = 2 * CPU_RANKS_PER_CORE * usable_cpu_cores()
HAS_CUDA = any(Path("/dev").glob("nvidia[0-9]*"))
USER_ENV_DROPS = ("WANDB_", "RANK", "WORLD_SIZE", "SLURM_")

# (kind as README.md names it, overrides ({data} is a folder of test files), what the message must say)
REFUSALS = [
    ("unknown reduction", ["reduction=summ"], ["reduction", "summ", "mean_of_means"]),
    ("world_size < 1", ["world_size=0"], ["world_size=0", ">= 1"]),
    ("sp not dividing world_size", ["sp=3"], ["sp=3 does not divide world_size=2", "valid sp: 1, 2"]),
    (
        "sp not dividing model.n_heads",
        ["world_size=8", "sp=8", "grad_accum=1"],
        ["model.n_heads=4", "valid sp for this model: 1, 2, 4"],
    ),
    ("sp not dividing train.seq_len", ["sp=2", "train.seq_len=127"], ["train.seq_len", "126 or 128"]),
    ("global batch not divisible by dp x grad_accum", ["grad_accum=3"], ["train.global_batch=16", "multiple of 6"]),
    ("dp_replicate < 1", ["dp_replicate=0"], ["dp_replicate=0", ">= 1"]),
    (
        "dp_replicate not dividing dp",
        ["world_size=4", "dp_replicate=3"],
        ["dp_replicate=3 does not divide dp = world_size / sp = 4 / 1 = 4", "valid dp_replicate: 1, 2, 4"],
    ),
    (
        "tp not dividing world_size",
        ["world_size=4", "tp=3"],
        ["tp=3 does not divide world_size=4", "valid tp: 1, 2, 4"],
    ),
    (
        "heads or sequence not splitting over sp x tp",
        ["world_size=8", "sp=2", "tp=4"],
        ["model.n_heads=4 cannot be split over sp x tp = 2 x 4 = 8 ranks", "valid sp for this model and tp: 1"],
    ),
    (
        "a vocabulary or feed-forward width not splitting over tp",
        ["world_size=4", "tp=4", "model.ffn_hidden=90"],
        ["the feed-forward width", "=90 cannot be split into tp=4 equal slices", "use a multiple of 4 (e.g. 92)"],
    ),
    (
        "tp with a Hugging Face model, tied embeddings or reduction=custom",
        ["model=hf_llama", "tp=2"],
        ["tp=2 is built for the runner's own decoder", "Hugging Face model: use tp=1"],
    ),
    (
        "pp not dividing world_size, or more stages than layers",
        ["pp=3", "world_size=4"],
        ["pp=3 does not divide world_size=4; valid pp: 1, 2, 4", "pp=3 stages need at least one layer each"],
    ),
    (
        "pp with sp, tp, a Hugging Face model, tied embeddings, reduction=custom, objective=pg or cost.modes",
        ["pp=2", "world_size=4", "sp=2"],
        ["sp=2 with pp=2: Ulysses sequence parallelism inside a pipeline stage is not built yet", "use sp=1"],
    ),
    (
        "pp_microbatches not splitting a micro-batch's rows, or fewer than 1F1B's stages",
        ["pp=2", "world_size=2", "pp_schedule=one_f_one_b", "pp_microbatches=1"],
        ["torch's Schedule1F1B needs at least as many micro-batches as stages", "use pp_microbatches >= 2"],
    ),
    ("grad_accum < 1", ["grad_accum=0"], ["grad_accum=0", ">= 1"]),
    ("train.steps < 1", ["train.steps=0"], ["train.steps=0", ">= 1"]),
    ("optim.lr <= 0", ["optim.lr=0"], ["optim.lr=0", "> 0"]),
    ("negative optim.clip", ["optim.clip=-1"], ["optim.clip=-1", ">= 0", "0 disables"]),
    ("unknown model", ["model=huge"], ["model=huge: conf/model/ has no preset huge", "tiny", "gpt2_124m"]),
    ("unknown optimizer", ["optim=adam"], ["optim=adam", "did you mean adamw?", "the presets: adamw, sgd"]),
    ("data without data.path", ["data=text"], ["data.path", "needs data.path=FILE_OR_FOLDER"]),
    ("data.path that does not exist", ["data.path={data}/missing.txt"], ["data.path=", "does not exist", ".jsonl"]),
    ("data.path with another suffix", ["data.path={data}/corpus.csv"], ["suffix '.csv'", "valid: .txt, .jsonl"]),
    ("empty data", ["data.path={data}/empty.txt"], ["data.path=", "no document of at least 2 bytes"]),
    (
        "JSONL without the text field",
        ["data.path={data}/records.jsonl"],
        ["line 2 has no field 'text'", "it has: body", "data.text_field"],
    ),
    ("JSONL line that is not JSON", ["data.path={data}/broken.jsonl"], ["line 1 is not JSON", "one record"]),
    (
        "data too short for one sequence",
        ["data.path={data}/short.txt", "data.packing=true"],
        ["train.seq_len=128 (needs 130)", "train.seq_len<=10"],
    ),
    (
        "world_size beyond this machine",
        [f"world_size={OVERSUBSCRIBED}", f"train.global_batch={OVERSUBSCRIBED}", "grad_accum=1"],
        [f"world_size={OVERSUBSCRIBED} would start", "dist.oversubscribe=true"],
    ),
    ("unknown key", ["optim.lrr=1"], ["optim.lrr"]),
    ("wrong type", ["world_size=two"], ["world_size", "two"]),
    ("unknown enum value", ["mp.reduce_dtype=float16"], ["mp.reduce_dtype", "float32", "bfloat16"]),
    ("unknown fault kind", ["fault.kind=explode"], ["fault.kind=explode", "valid: none, raise, exit, kill, hang, nan"]),
    ("wandb.mode=online without a key", ["wandb.mode=online"], ["wandb.mode=online needs WANDB_API_KEY", "make sync"]),
    ("any numeric field out of its range", ["seed=-1"], ["seed=-1 must be >= 0"]),
    ("model shape", ["model.d_model=30"], ["model.d_model=30", "use a multiple of 8 (e.g. 24 or 32)"]),
    (
        "too big for this machine's memory",
        ["train.global_batch=1000000000000"],
        ["GiB", "for the activations of one micro-batch", "train.global_batch=1000000000000"],
    ),
    ("a key the schema lacks, with or without `+`", ["+reductions=sum"], ["reductions", "did you mean reduction?"]),
    ("data that is not UTF-8 text", ["data.path={data}/binary.txt"], ["binary.txt is not UTF-8 text (byte 6"]),
    ("device=cuda without a CUDA device", ["device=cuda"], ["no CUDA device is visible", "device=cpu"]),
    ("model=hf without model.config", ["model=hf"], ["no model_type", "model.config=PATH/config.json"]),
    (
        "model.config that does not exist",
        ["model=hf", "model.config={data}/missing/config.json"],
        ["model.config=", "does not exist", "config.json"],
    ),
    (
        "model.config that is not a causal LM",
        ["model=hf", "model.config={data}/bert.json"],
        ["not a causal LM", "BertForMaskedLM", "*ForCausalLM"],
    ),
    (
        "model vocab smaller than the data's",
        ["model=hf_llama", "model.overrides.vocab_size=200"],
        ["vocab_size=200 must be >= 256 (byte-level tokens)", "model.overrides.vocab_size=256"],
    ),
    (
        "an HF size no model can have",
        ["model=hf_llama", "model.overrides.num_key_value_heads=3"],
        ["model.overrides.num_key_value_heads=3", "valid num_key_value_heads: 1, 2, 4"],
    ),
    (
        "sp not dividing the HF model's heads",
        ["model=hf_qwen2", "model.overrides.num_attention_heads=2", "world_size=4", "sp=4", "grad_accum=1"],
        ["num_attention_heads=2 cannot be split over sp=4", "valid sp for this model: 1, 2"],
    ),
    (
        "data.tokenizer that does not exist",
        ["data.tokenizer={data}/missing.json"],
        ["data.tokenizer=", "does not exist"],
    ),
    (
        "tokenizer vocab larger than the model's",
        ["data.tokenizer={data}/tokenizer.json"],
        ["model.vocab_size=256 must be >= 384", "set model.vocab_size=384 or more"],
    ),
    # custom.fn is imported in a subprocess of the launcher (stdlib modules here, importable from any directory):
    ("reduction=custom without custom.fn", ["reduction=custom"], ["reduction=custom needs custom.fn=MODULE:CALLABLE"]),
    (
        "custom.fn without a colon",
        ["reduction=custom", "custom.fn=json.dumps"],
        ["custom.fn=json.dumps is not MODULE:CALLABLE"],
    ),
    (
        "custom.fn module not found",
        ["reduction=custom", "custom.fn=no_such_module:loss"],
        ["custom.fn=no_such_module:loss", "no module named 'no_such_module'"],
    ),
    (
        "custom.fn attribute missing",
        ["reduction=custom", "custom.fn=json:nothing"],
        [
            "custom.fn=json:nothing",
            "no attribute 'nothing'",
            "its functions: detect_encoding, dump, dumps, load, loads",
        ],
    ),
    (
        "custom.fn not callable",
        ["reduction=custom", "custom.fn=json:decoder"],
        ["custom.fn=json:decoder", "not callable"],
    ),
    (
        "custom.fn with other parameters",
        ["reduction=custom", "custom.fn=json:dumps"],
        ["custom.fn=json:dumps", "cannot be called as fn(logits, labels, ctx)"],
    ),
    (
        "unreadable custom.expect",
        ["reduction=custom", "custom.fn=builtins:pow", "custom.expect=sideways"],
        ["custom.expect=sideways", "grad L / W"],
    ),
    (
        "custom in a cost job",
        ["cost.modes=[local,custom]"],
        ["cost.modes=['local', 'custom']", "not a custom callable"],
    ),
    (
        "another all-reduce in a cost job",
        ["experiment=cost", "autograd_all_reduce=identity"],
        ["autograd_all_reduce=identity with cost.modes=", "use autograd_all_reduce=funcol"],
    ),
    ("an empty string", ["data.path=''"], ["data.path='' is empty", "data.path=null"]),
    (
        "a key the job would not read",
        ["reduction=local", "autograd_all_reduce=identity"],
        ["autograd_all_reduce=identity is not read by this job", "drop autograd_all_reduce"],
    ),
    (
        "a trainer whose rule the job replaces",
        ["trainer=xtuner", "reduction=sum"],
        ["trainer=xtuner sets reduction=custom, but this job has reduction=sum"],
    ),
    (
        "a model.overrides key the config class lacks",
        ["model=hf_llama", "model.overrides.num_hidden_layer=4"],
        ["model.overrides.num_hidden_layers"],
    ),
    (
        "a rotary model's odd head size",
        ["model=hf_llama", "model.overrides.hidden_size=12"],
        ["rotary embeddings rotate feature pairs", "hidden_size=8 or 16"],
    ),
    (
        "attention Ulysses cannot wrap",
        ["model=hf_llama", "model.overrides.attention_dropout=0.1", "sp=2", "grad_accum=1"],
        ["use sp=1", "attention_dropout"],
    ),
    (
        "data.tokenizer a folder without tokenizer.json",
        ["data.tokenizer={data}/no_tokenizer"],
        ["is a folder without tokenizer.json", "give a tokenizer.json"],
    ),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    (folder / "corpus.csv").write_text("a,b\n")
    (folder / "empty.txt").write_text("\n\n")
    (folder / "short.txt").write_text("short text\n")
    (folder / "records.jsonl").write_text(
        json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text field"}) + "\n"
    )
    (folder / "broken.jsonl").write_text("{not json\n")
    (folder / "binary.txt").write_bytes(b"text, \xff\xfe then bytes")
    bert = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "num_attention_heads": 4, "vocab_size": 512}
    (folder / "bert.json").write_text(json.dumps(bert))
    train_tokenizer(folder / "tokenizer.json", 384)
    (folder / "no_tokenizer").mkdir()
    (folder / "no_tokenizer" / "vocab.txt").write_text("a\n")
    return folder


# The cases also launched as `python -m runner`: one for each way the CLI refuses before any rank starts.
CLI_LAUNCHED = {
    "unknown key": "runner/__main__.py's own check of the overrides' keys, before Hydra starts",
    "wrong type": "Hydra's composition fails (its exit status 1, made 2 by runner/__main__.py)",
    "data.path that does not exist": "the job's `admit` refuses it: summary.json records `invalid`",
    "device=cuda without a CUDA device": "valid, but not on this machine: summary.json records `skipped`",
}


@pytest.fixture
def user_env(monkeypatch, tmp_path):
    """The environment of a user's shell: no W&B key (nor a ~/.netrc holding one), no launcher's rank variables."""
    for key in list(os.environ):
        if key.startswith(USER_ENV_DROPS):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture(scope="module")
def custom_fns_checked():
    """Every custom.fn of the cases checked in one subprocess, as a sweep's preflight checks its callables
    (`check_all`); the single runs' `admit` then answers from it. Forgotten after this file."""
    check_all(
        [arg.split("=", 1)[1] for _, overrides, _ in REFUSALS for arg in overrides if arg.startswith("custom.fn=")]
    )
    yield
    forget_checked()


def skip_cuda_case_on_a_cuda_machine(overrides: list[str]) -> None:
    if "device=cuda" in overrides and HAS_CUDA:
        pytest.skip("this machine has a CUDA device")


@pytest.mark.parametrize("kind, overrides, expected", REFUSALS, ids=[kind for kind, _, _ in REFUSALS])
def test_refused_before_launch_with_exit_status_2(kind, overrides, expected, data_dir, user_env, custom_fns_checked):
    skip_cuda_case_on_a_cuda_machine(overrides)
    verdict = cli_verdict([arg.format(data=data_dir) for arg in overrides])
    assert verdict.code == EXIT_INVALID, verdict.message
    for text in expected:
        assert text in verdict.message, verdict.message
    if verdict.status is not None:  # composed, then refused by the runner's own rules
        assert verdict.status == ("skipped" if kind.startswith("device=cuda") else "invalid")  # valid, but not here


LAUNCHED = [case for case in REFUSALS if case[0] in CLI_LAUNCHED]


@pytest.mark.parametrize("kind, overrides, expected", LAUNCHED, ids=[kind for kind, _, _ in LAUNCHED])
def test_refused_by_a_real_launch_with_exit_status_2(kind, overrides, expected, data_dir, tmp_path):
    skip_cuda_case_on_a_cuda_machine(overrides)
    environ = {key: value for key, value in os.environ.items() if not key.startswith(USER_ENV_DROPS)}
    environ["HOME"] = str(tmp_path)  # no ~/.netrc holding a W&B key
    args = [arg.format(data=data_dir) for arg in overrides]
    done = subprocess.run(
        [sys.executable, "-m", "runner", *args, "hydra.run.dir=run"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_INVALID, output
    for text in expected:
        assert text in output
    assert not (tmp_path / "run" / "logs").exists()  # no rank started
    if (tmp_path / "run" / "summary.json").exists():  # composed, then refused by the runner's own rules
        status = json.loads((tmp_path / "run" / "summary.json").read_text())["status"]
        assert status == ("skipped" if kind.startswith("device=cuda") else "invalid")  # valid, but not here


def test_every_launched_case_is_a_case():
    assert set(CLI_LAUNCHED) <= {kind for kind, _, _ in REFUSALS}


def test_docs_list_every_refusal():
    section = REFUSALS_PAGE.read_text().split("## Refused before launch", 1)[1].split("\n#", 1)[0]
    kinds = re.findall(r"^\| ([^|]+?) \|", section, flags=re.MULTILINE)[1:]  # after the header
    assert sorted(kinds) == sorted(kind for kind, _, _ in REFUSALS)
    assert len(kinds) >= 15
    # A row's example, where it is overrides, is its case's (files named without the test's folder), so that
    # the example as shown is refused for the reason its row gives, not by another rule first.
    examples = dict(re.findall(r"^\| ([^|]+?) \| ([^|]*) \|", section, flags=re.MULTILINE)[1:])
    for kind, overrides, _ in REFUSALS:
        shown = [example for example in re.findall(r"`([^`]*)`", examples[kind]) if "=" in example]
        case = " ".join(overrides).replace("{data}/", "")
        if shown and not (kind == "world_size beyond this machine" and OVERSUBSCRIBED != 16):  # shown for 2 cores
            assert case in shown, f"{kind}: the table shows {shown}, the test runs {case}"


def test_oversubscription_depends_on_the_machine_and_can_be_forced():
    cfg = run_config(world_size=16)
    assert [field for field, _ in machine_problems(cfg, cuda_devices=0, cpu_cores=2)] == ["world_size"]
    assert machine_problems(cfg, cuda_devices=0, cpu_cores=4) == []  # 4 ranks per core
    assert machine_problems(cfg, cuda_devices=16, cpu_cores=2) == []  # GPU ranks: one per device (else skipped)
    assert (
        machine_problems(run_config(world_size=16, device="cuda"), cuda_devices=0, cpu_cores=2) == []
    )  # skipped, not refused
    forced = OmegaConf.merge(cfg, {"dist": {"oversubscribe": True}})
    assert machine_problems(forced, cuda_devices=0, cpu_cores=2) == []
