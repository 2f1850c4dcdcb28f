"""Hugging Face models train as they are: a mapping batch reaches the model as keyword arguments, the model's
own loss is the loss, its logits feed evaluation and per-sample losses, and a run equals a ``torch.optim`` loop.

Models are built from tiny configs with random weights (no download) and dropout off.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torchmetrics

from composer_fn import optim
from composer_fn.testing.differential import ADAMW, SGD_MOMENTUM, OptimizerPair, update_errors
from composer_fn.testing.models import language_model, token_batches
from composer_fn.trainer import Trainer
from composer_fn.trainer.evaluator import Evaluator
from composer_fn.trainer.outputs import default_per_sample_loss

transformers = pytest.importorskip("transformers")

VOCAB = 50


def _gpt2(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _bert(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=VOCAB,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def _lm_batches(count: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    # Rows padded on the right at random lengths; labels -100 at the pads, as a collator makes them.
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(1, VOCAB, (2, 8), generator=generator)
        lengths = torch.randint(3, 9, (2,), generator=generator)
        mask = (torch.arange(8) < lengths[:, None]).long()
        ids = ids.masked_fill(mask == 0, 0)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return batches


def _classification_batches(count: int, seed: int = 2) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for lm in _lm_batches(count, seed):
        labels = torch.randint(0, 3, (2,), generator=generator)
        batches.append({**{k: lm[k] for k in ("input_ids", "attention_mask")}, "labels": labels})
    return batches


def _reference(
    model: Any, batches: list[dict[str, torch.Tensor]], optimizer: OptimizerPair, float64: bool = False
) -> dict[str, torch.Tensor]:
    # The hand-written loop: the model's own loss on each batch, backward, torch.optim's step.
    trained = copy.deepcopy(model).train()
    trained = trained.double() if float64 else trained
    steps = optimizer.reference(trained.parameters())
    for batch in batches:
        steps.zero_grad(set_to_none=True)
        trained(**batch).loss.backward()
        steps.step()
    return {name: p.detach().clone() for name, p in trained.named_parameters()}


@pytest.mark.parametrize("optimizer", [SGD_MOMENTUM, ADAMW], ids=["sgd", "adamw"])
@pytest.mark.parametrize("name", ["gpt2", "bert-mlm", "llama"])
def test_a_language_model_trained_twenty_steps_on_padded_batches_equals_its_torch_optim_loop(
    name: str, optimizer: OptimizerPair
) -> None:
    model = _gpt2() if name == "gpt2" else language_model(name)
    batches = _lm_batches(20) if name == "gpt2" else token_batches(20, kind="masked" if name == "bert-mlm" else "causal")
    assert any(bool((b["attention_mask"] == 0).any()) for b in batches)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    expected = _reference(model, batches, optimizer)
    trainer = Trainer(copy.deepcopy(model), batches, max_duration="20ba", optimizer=optimizer.ours(), progress_bar=False)
    trainer.fit()
    errors = update_errors(initial, dict(trainer.state.params), expected)
    # A parameter whose gradient is zero but for rounding (the attention's key bias: softmax ignores a shift
    # shared by every key) moves by rounding noise alone, which AdamW scales up to whole steps: each parameter
    # may be off by a small tolerance plus a few times torch's own fp32 distance from float64 arithmetic there.
    rounding = update_errors(initial, expected, _reference(model, batches, optimizer, float64=True))
    failed = {n: (e, rounding[n]) for n, e in errors.items() if e > 1e-5 + 10 * rounding[n]}
    assert not failed, failed


def test_the_first_step_loss_is_the_models_own_loss_with_the_attention_mask_and_labels() -> None:
    model, [batch] = _gpt2(), _lm_batches(1)
    trainer = Trainer(copy.deepcopy(model), [batch], max_duration="1ba", optimizer=optim.sgd(0.0), progress_bar=False)
    trainer.fit()
    with torch.no_grad():
        expected = model(**batch).loss
        unmasked = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    assert float(expected) != pytest.approx(float(unmasked))
    assert trainer.metrics["loss"] == pytest.approx(float(expected), rel=1e-6)


def test_a_bert_classifier_trains_and_evaluates_its_accuracy_from_its_logits() -> None:
    model, batches = _bert(), _classification_batches(3)
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
    evaluators = [Evaluator("eval", batches), Evaluator("metrics", batches, {"accuracy": accuracy})]
    trainer = Trainer(model, batches, evaluators, max_duration="3ba", optimizer=optim.adamw(1e-2), progress_bar=False)
    metrics = trainer.fit()
    trained = trainer.model
    with torch.no_grad():
        logits = [trained(**{k: v for k, v in b.items() if k != "labels"}).logits for b in batches]
    predicted = torch.cat([lg.argmax(1) for lg in logits])
    labels = torch.cat([b["labels"] for b in batches])
    expected = float((predicted == labels).float().mean())
    assert metrics["eval/eval/accuracy"] == pytest.approx(expected)
    assert metrics["eval/metrics/accuracy"] == pytest.approx(expected)
    losses = [torch.nn.functional.cross_entropy(lg, b["labels"]) for lg, b in zip(logits, batches, strict=True)]
    assert metrics["eval/eval/loss"] == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)
    assert any(not torch.equal(p, q) for p, q in zip(trained.parameters(), model.parameters(), strict=True))


def test_a_causal_lm_evaluates_next_token_accuracy_over_labelled_positions() -> None:
    model, batches = _gpt2(), _lm_batches(2)
    trainer = Trainer(model, batches[:1], batches, max_duration="1ba", optimizer=optim.sgd(0.0), progress_bar=False)
    metrics = trainer.eval()
    correct = labelled = 0
    with torch.no_grad():
        for batch in batches:
            predicted, labels = model.eval()(**batch).logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
            correct += int(((predicted == labels) & (labels != -100)).sum())
            labelled += int((labels != -100).sum())
    assert metrics["eval/eval/accuracy"] == pytest.approx(correct / labelled)
    [predicted_batch] = trainer.predict(batches[:1])
    torch.testing.assert_close(predicted_batch.logits, model(**batches[0]).logits.detach())


def test_the_per_sample_loss_of_a_causal_lm_is_each_samples_own_loss() -> None:
    model, [batch] = _gpt2(), _lm_batches(1)
    with torch.no_grad():
        losses = default_per_sample_loss(None, causal=True)(model(**batch), batch)
        alone = [model(**{k: v[i : i + 1] for k, v in batch.items()}).loss for i in range(2)]
    torch.testing.assert_close(losses, torch.stack(alone))


def test_selective_backprop_prunes_a_gpt2_batch_by_its_per_sample_losses() -> None:
    from composer_fn.algorithms import SelectiveBackprop

    algorithm = SelectiveBackprop(start=0.0, end=1.0, interrupt=0, keep=0.5, input_key="input_ids", target_key="labels")
    trainer = Trainer(_gpt2(), _lm_batches(2), max_duration="2ba", optimizer=optim.adamw(1e-3), algorithms=[algorithm], progress_bar=False)
    metrics = trainer.fit()
    assert torch.isfinite(torch.tensor(metrics["loss"]))


def test_labels_the_classifier_has_no_class_for_are_refused_before_the_first_step() -> None:
    batches = _classification_batches(1)
    batches[0]["labels"] = torch.tensor([0, 5])
    trainer = Trainer(_bert(), batches, max_duration="1ba", optimizer=optim.sgd(0.1), progress_bar=False)
    with pytest.raises(ValueError, match=r"batch\['labels'\]\) hold class 5, but the model's outputs have 3 classes"):
        trainer.fit()
    assert trainer.timestamp.batch == 0


def test_a_mapping_batch_the_models_forward_takes_nothing_of_is_refused_naming_input_key() -> None:
    batches = [{"tokens": b["input_ids"], "labels": b["labels"]} for b in _lm_batches(1)]
    trainer = Trainer(_gpt2(), batches, max_duration="1ba", optimizer=optim.sgd(0.1), progress_bar=False)
    with pytest.raises(ValueError, match=r"input_key=None: .* keys \['tokens', 'labels'\].*GPT2LMHeadModel.forward takes no input among them"):
        trainer.fit()


def test_an_explicit_input_key_calls_the_model_with_that_item_alone() -> None:
    # The model then computes no loss: the default loss reads the logits against the targets.
    model, [batch] = _bert(), _classification_batches(1)
    trainer = Trainer(copy.deepcopy(model), [batch], max_duration="1ba", optimizer=optim.sgd(0.0), input_key="input_ids", progress_bar=False)
    trainer.fit()
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(input_ids=batch["input_ids"]).logits, batch["labels"])
    assert trainer.metrics["loss"] == pytest.approx(float(expected), rel=1e-6)


def test_a_microbatched_bert_step_equals_the_whole_batch_step() -> None:
    model, batches = _bert(), _classification_batches(2)
    runs = []
    for size in (None, 1):
        trainer = Trainer(copy.deepcopy(model), batches, max_duration="2ba", optimizer=optim.sgd(0.1), device_train_microbatch_size=size, progress_bar=False)
        trainer.fit()
        runs.append(trainer.state.params)
    for name, value in runs[0].items():
        torch.testing.assert_close(runs[1][name], value, rtol=1e-5, atol=1e-6)


def test_a_padded_language_model_batch_cut_into_microbatches_trains_as_the_whole_batch() -> None:
    # Rows of other lengths: each microbatch weighs by its labelled tokens, not its rows, so the step is the
    # whole batch's mean over its tokens (weighing by rows, it was off by 1e-2 after three steps).
    model, batches = language_model("gpt2"), token_batches(3, batch_size=4, length=16)

    def run(**options: Any) -> dict[str, torch.Tensor]:
        trainer = Trainer(
            copy.deepcopy(model), batches, max_duration="3ba", optimizer=optim.sgd(0.1), progress_bar=False, **options
        )
        trainer.fit()
        return dict(trainer.state.params)

    whole = run()
    for size in (1, 2, 3):
        cut = run(device_train_microbatch_size=size)
        for name, value in whole.items():
            torch.testing.assert_close(cut[name], value, rtol=0, atol=1e-6)


def test_a_language_models_evaluation_loss_is_its_mean_over_tokens_however_its_rows_are_batched() -> None:
    rows = token_batches(1, batch_size=6, length=16, seed=9)[0]
    model = language_model("gpt2")

    def loss(splits: list[tuple[int, int]]) -> float:
        held_out = [{name: item[start:end] for name, item in rows.items()} for start, end in splits]
        trainer = Trainer(
            copy.deepcopy(model), token_batches(1), eval_dataloader=Evaluator("held_out", held_out),
            max_duration="1ba", optimizer=optim.sgd(0.0), progress_bar=False,
        )  # fmt: skip
        return trainer.eval()["eval/held_out/loss"]

    whole = loss([(0, 6)])
    with torch.no_grad():
        expected = float(model.eval()(**rows).loss)
    assert whole == pytest.approx(expected, abs=1e-6)
    assert loss([(0, 1), (1, 6)]) == pytest.approx(whole, abs=1e-6)
    assert loss([(0, 2), (2, 3), (3, 6)]) == pytest.approx(whole, abs=1e-6)


def test_resolving_a_gpt2_s_loss_function_for_the_step_leaves_the_given_model_as_it_is() -> None:
    from composer_fn.trainer.outputs import settle_loss_function

    model = language_model("gpt2")
    settled = settle_loss_function(model)
    assert "_loss_function" not in vars(model) and "_loss_function" in vars(settled)
    assert all(a is b for a, b in zip(model.parameters(), settled.parameters(), strict=True))
    plain = torch.nn.Linear(2, 2)
    assert settle_loss_function(plain) is plain
