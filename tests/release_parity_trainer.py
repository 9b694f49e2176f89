"""A released `transformers.Trainer` for one optimizer step on a tiny model whose forward takes no loss kwargs
(tests/test_release_parity.py runs this file in a subprocess, the release first on PYTHONPATH).

`python release_parity_trainer.py CASE OUT`: CASE (torch.save) holds the model's state_dict, the rows
(input_ids, shifted labels) and M; OUT gets the transformers version that ran, the accumulated gradient as
`on_pre_optimizer_step` sees it (clipping off), what each `training_step` returned, and the logged loss.
`TinyLM` imports torch alone, so that the test builds the same model beside the project's rules.
"""

from __future__ import annotations

import sys

import torch


class TinyLM(torch.nn.Module):
    """Embedding, one tanh layer, a head; forward(input_ids, labels) returns its own token mean: no **kwargs, so
    the Trainer's `model_accepts_loss_kwargs` is False."""

    def __init__(self, vocab: int = 32, width: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.hidden = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.head(torch.tanh(self.hidden(self.embed(input_ids))))
        if labels is None:
            return {"logits": logits}
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


class Rows(torch.utils.data.Dataset):
    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor):
        self.inputs, self.labels = inputs, labels

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.inputs[i], "labels": self.labels[i]}


def main(case_path: str, out_path: str) -> None:
    import transformers
    from transformers import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    case = torch.load(case_path)
    model = TinyLM(*case["shape"])
    model.load_state_dict(case["state"])
    seen: dict = {"returned": []}

    class Gradient(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):  # after clipping (off), before the step
            seen["grads"] = {n: p.grad.detach().clone() for n, p in kwargs["model"].named_parameters()}

    class Recording(Trainer):
        def training_step(self, *args, **kwargs):  # the release's own step, its return value recorded
            loss = super().training_step(*args, **kwargs)
            seen["returned"].append(loss.item())
            return loss

    rows, micro = len(case["inputs"]), case["grad_accum"]
    args = TrainingArguments(
        output_dir=str(case["output_dir"]),
        per_device_train_batch_size=rows // micro,
        gradient_accumulation_steps=micro,
        max_steps=1,
        max_grad_norm=0.0,  # no clipping: the gradient as accumulated
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Recording(
        model=model, args=args, train_dataset=Rows(case["inputs"], case["labels"]), callbacks=[Gradient()]
    )
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    torch.save(
        {
            "version": transformers.__version__,
            "accepts_loss_kwargs": trainer.model_accepts_loss_kwargs,
            "grads": seen["grads"],
            "returned": seen["returned"],
            "logged": logged,
        },
        out_path,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
