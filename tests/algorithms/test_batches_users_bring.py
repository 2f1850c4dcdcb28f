"""The data-side methods on the batches and models users bring: Hugging Face collators' ``-100`` labels and
``ModelOutput``s, classification labels beside token sequences, sequence activations, fixed-size vision
transformers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from composer_fn.algorithms import Alibi, CutMix, GyroDropout, LabelSmoothing, MixUp, ProgressiveResizing
from composer_fn.algorithms.gyro_dropout import GyroDropoutLayer
from composer_fn.core import random as R
from composer_fn.core.state import State, StepCtx
from composer_fn.data import TensorLoader, synthetic_images
from composer_fn.functional import (
    cutmix_targets,
    fixed_input_size,
    mixup_targets,
    scale_batch_sequence_length,
    set_batch_sequence_length,
    smooth_labels,
)
from composer_fn.models import SmallCNN
from composer_fn.optim import sgd
from composer_fn.trainer import Trainer, cross_entropy_loss

_STATE = State.__new__(State)


def _ctx(batch, outputs, loss=None) -> StepCtx:
    return StepCtx(batch=batch, key=R.key(0), loss_fn=lambda o, b: o.sum(), outputs=outputs, loss=loss)


def _token_targets(seed: int, rows: int = 2, length: int = 6, vocab: int = 7) -> torch.Tensor:
    targets = R.randint(R.key(seed), 0, vocab, (rows, length))
    targets[0, :2] = -100
    targets[1, -1] = -100
    return targets


# -- LabelSmoothing and the -100 ignore label -------------------------------------------------------------


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_smoothing_token_logits_with_ignored_positions_gives_torchs_ignore_index_label_smoothing(
    smoothing: float,
) -> None:
    logits, targets = R.normal(R.key(1), (2, 6, 7)), _token_targets(2)
    algorithm = LabelSmoothing(smoothing=smoothing)
    _, ctx = algorithm._smooth(_STATE, _ctx((logits, targets), logits))
    assert ctx.batch[1] is targets
    loss = cross_entropy_loss(1)(logits, ctx.batch)
    _, ctx = algorithm._restore(_STATE, ctx.replace(loss=loss))
    reference = F.cross_entropy(logits.movedim(-1, 1), targets, ignore_index=-100, label_smoothing=smoothing)
    torch.testing.assert_close(ctx.loss, reference)


def test_smoothing_dense_targets_with_ignored_positions_gives_torchs_ignore_index_label_smoothing() -> None:
    logits, targets = R.normal(R.key(1), (2, 7, 2, 3)), _token_targets(2).reshape(2, 2, 3)
    algorithm = LabelSmoothing(smoothing=0.2)
    _, ctx = algorithm._smooth(_STATE, _ctx((logits, targets), logits))
    soft = ctx.batch[1]
    assert bool((soft.movedim(1, -1)[targets == -100] == 0).all())
    reference = F.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.2)
    torch.testing.assert_close(cross_entropy_loss(1)(logits, ctx.batch), reference)
    _, ctx = algorithm._restore(_STATE, ctx)
    assert ctx.batch[1] is targets


def test_an_ignored_position_smooths_to_a_row_of_zeros_and_the_others_sum_to_one() -> None:
    smoothed = smooth_labels(R.normal(R.key(0), (2, 6, 7)), _token_targets(3), 0.2)
    sums = smoothed.sum(-1)
    torch.testing.assert_close(sums[_token_targets(3) != -100], torch.ones(9))
    assert bool((sums[_token_targets(3) == -100] == 0).all())


def test_a_mapping_batch_reads_its_targets_from_labels() -> None:
    logits = R.normal(R.key(1), (4, 3))
    batch = {"input_ids": torch.zeros(4, 5, dtype=torch.long), "labels": torch.tensor([0, 2, -100, 1])}
    _, ctx = LabelSmoothing(smoothing=0.1)._smooth(_STATE, _ctx(batch, logits))
    reference = F.cross_entropy(logits, batch["labels"], label_smoothing=0.1)
    torch.testing.assert_close(F.cross_entropy(logits, ctx.batch["labels"]), reference)


def _smoothed_loss(outputs, batch, smoothing: float) -> torch.Tensor:
    algorithm = LabelSmoothing(smoothing=smoothing)
    _, ctx = algorithm._smooth(_STATE, _ctx(batch, outputs))
    assert ctx.batch is batch
    _, ctx = algorithm._restore(_STATE, ctx.replace(loss=outputs.loss))
    assert ctx.loss is not None
    return ctx.loss


def test_a_hugging_face_model_s_own_loss_is_smoothed_as_torch_smooths_it() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    causal = transformers.GPT2LMHeadModel(config).eval()
    input_ids = R.randint(R.key(4), 0, 50, (2, 8))
    attention_mask = torch.ones(2, 8, dtype=torch.long)
    attention_mask[1, 5:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    with torch.no_grad():
        outputs = causal(**batch)
        loss = _smoothed_loss(outputs, batch, 0.1)
    shifted = outputs.logits[:, :-1].reshape(-1, 50)
    reference = F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100, label_smoothing=0.1)
    torch.testing.assert_close(loss, reference)

    bert = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3,
    )
    classifier = transformers.BertForSequenceClassification(bert).eval()
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": torch.tensor([2, 0])}
    with torch.no_grad():
        outputs = classifier(**batch)
        loss = _smoothed_loss(outputs, batch, 0.2)
    torch.testing.assert_close(loss, F.cross_entropy(outputs.logits, batch["labels"], label_smoothing=0.2))


def test_the_trainer_smooths_a_gpt2_s_own_loss_over_its_labelled_positions() -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("composer_fn.trainer.outputs")  # models called with the batch as keyword arguments
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    input_ids = R.randint(R.key(6), 1, 50, (2, 8))
    attention_mask = (torch.arange(8) < torch.tensor([[8], [5]])).long()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    trainer = Trainer(
        copy.deepcopy(model), [batch], max_duration="1ba", optimizer=sgd(0.0), algorithms=[LabelSmoothing(0.1)],
        progress_bar=False,
    )
    trainer.fit()
    with torch.no_grad():
        logits = model(**batch).logits
    shifted = logits[:, :-1].reshape(-1, 50)
    reference = F.cross_entropy(shifted, batch["labels"][:, 1:].reshape(-1), label_smoothing=0.1)
    assert trainer.metrics["loss"] == pytest.approx(float(reference), rel=1e-5)


# -- MixUp and CutMix with -100 ---------------------------------------------------------------------------


def test_mixing_an_ignored_label_gives_only_the_partner_s_share() -> None:
    targets, indices = torch.tensor([1, -100, 2]), torch.tensor([1, 2, 0])
    mixed = mixup_targets(targets, indices, 0.25, 3)
    expected = torch.tensor([[0.0, 0.75, 0.0], [0.0, 0.0, 0.25], [0.0, 0.25, 0.75]])
    torch.testing.assert_close(mixed, expected)
    params = CutMix().mix_inputs(R.key(0), torch.zeros(3, 1, 4, 4), torch.tensor(0.5))[1]
    partner_share = 1 - params.area.expand(3)
    mixed = cutmix_targets(targets, params.__class__(params.bbox, indices, params.area), 3)
    torch.testing.assert_close(mixed.sum(1), torch.stack([1 - partner_share[0], partner_share[1], torch.tensor(1.0)]))


@pytest.mark.parametrize("algorithm", [MixUp(alpha=1.0), CutMix(alpha=1.0)], ids=["mixup", "cutmix"])
def test_mixing_reads_the_classes_from_a_mapping_output_s_logits(algorithm) -> None:
    images = R.uniform(R.key(0), (2, 1, 4, 4))
    batch = {"pixel_values": images, "labels": torch.tensor([1, -100])}
    algorithm = type(algorithm)(alpha=1.0, input_key="pixel_values", target_key="labels")
    mixed, pairing = algorithm.mix_inputs(R.key(0), images, torch.tensor(0.3))
    ctx = _ctx(batch, {"logits": torch.zeros(2, 5)}).with_scratch(algorithm.name, pairing)
    _, ctx = algorithm._mix_targets(_STATE, ctx)
    assert ctx.batch["labels"].shape == (2, 5)


def test_a_model_s_own_loss_gives_way_to_the_mixed_targets() -> None:
    images, labels = R.uniform(R.key(0), (2, 1, 4, 4)), torch.tensor([1, 2])
    logits = R.normal(R.key(1), (2, 3))
    batch = {"pixel_values": images, "labels": labels}
    outputs = {"loss": torch.tensor(99.0), "logits": logits}
    mixing = MixUp(alpha=1.0, input_key="pixel_values", target_key="labels")
    _, pairing = mixing.mix_inputs(R.key(0), images, torch.tensor(0.3))
    _, ctx = mixing._mix_targets(_STATE, _ctx(batch, outputs).with_scratch(mixing.name, pairing))
    torch.testing.assert_close(ctx.loss_fn(outputs, ctx.batch), F.cross_entropy(logits, ctx.batch["labels"]))
    interpolating = MixUp(alpha=1.0, interpolate_loss=True, input_key="pixel_values", target_key="labels")
    ctx = _ctx(batch, outputs, loss=F.cross_entropy(logits, labels)).with_scratch(interpolating.name, pairing)
    _, ctx = interpolating._mix_loss(_STATE, ctx)
    partner = F.cross_entropy(logits, labels[pairing.indices])
    torch.testing.assert_close(ctx.loss, torch.lerp(F.cross_entropy(logits, labels), partner, torch.tensor(0.3)))


# -- Sequence batches with classification labels and masks ------------------------------------------------


def _text_batch() -> dict[str, torch.Tensor]:
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 10:] = 0
    return {
        "labels": torch.tensor([1, 0]),
        "input_ids": R.randint(R.key(5), 1, 50, (2, 16)) * attention_mask,
        "attention_mask": attention_mask,
        "token_type_ids": (torch.arange(16) >= 8).long().expand(2, 16),
    }


def test_seq_length_warmup_cuts_tokens_with_their_masks_and_keeps_classification_labels() -> None:
    batch = _text_batch()
    cut = set_batch_sequence_length(batch, 8)
    assert cut["labels"] is batch["labels"]
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(cut[name], batch[name][:, :8])
    kept = set_batch_sequence_length(batch, 8, preserve_end_of_sequence=True)
    assert kept["labels"] is batch["labels"]
    assert kept["input_ids"][1, 7] == batch["input_ids"][1, 9]
    with pytest.raises(ValueError, match=r"batch item 'labels' has shape \(2,\): truncate=False re-cuts"):
        set_batch_sequence_length(batch, 8, truncate=False)


def test_alibi_rows_keep_each_token_s_mask_and_refuse_classification_labels() -> None:
    batch = _text_batch()
    tokens_only = {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
    rows = scale_batch_sequence_length(tokens_only, 0.25)
    for name, tensor in tokens_only.items():
        assert torch.equal(rows[name], tensor.reshape(8, 4))
    with pytest.raises(ValueError, match=r"'labels' of shape \(2,\).*train_sequence_length_scaling=1.0"):
        scale_batch_sequence_length(batch, 0.25)
    assert scale_batch_sequence_length(batch, 1.0) is batch
    _, ctx = Alibi(train_sequence_length_scaling=0.5)._reshape(8, _STATE, _ctx(tokens_only, None))
    assert ctx.batch["attention_mask"].shape == (4, 8)


# -- GyroDropout on sequence activations ------------------------------------------------------------------


def test_gyro_dropout_masks_features_of_every_token_not_whole_tokens() -> None:
    layer = GyroDropoutLayer(0.5, sigma=8, tau=2, period=3, mask_key=R.key(0))
    output = layer(torch.ones(2, 5, 12))
    for sample in range(2):
        assert torch.equal(output[sample], output[sample, :1].expand(5, 12))
    assert 0 < int((output[0, 0] == 0).sum()) < 12


class _SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.1)


def test_gyro_dropout_leaves_the_attention_probability_dropouts_as_they_are() -> None:
    model = nn.Sequential(_SelfAttention(), nn.Linear(4, 4), nn.Dropout(0.1))
    rewritten = GyroDropout(sigma=4, tau=2).rewrite(model, R.key(0))
    assert type(rewritten[0].dropout) is nn.Dropout and rewritten[0].dropout.p == 0.1
    assert isinstance(rewritten[2], GyroDropoutLayer)

    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    gpt2 = GyroDropout(sigma=4, tau=2).rewrite(transformers.GPT2LMHeadModel(config), R.key(0))
    attention = gpt2.transformer.h[0].attn
    assert type(attention.attn_dropout) is nn.Dropout and attention.attn_dropout.p == config.attn_pdrop
    assert isinstance(attention.resid_dropout, GyroDropoutLayer)


# -- ProgressiveResizing on fixed-size models -------------------------------------------------------------


def _tiny_vit() -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=4
    )


def test_progressive_resizing_refuses_a_fixed_size_vit_before_the_first_step() -> None:
    images, labels = synthetic_images(R.key(0), 8, num_classes=4, shape=(3, 32, 32))
    refusal = r"ProgressiveResizing\(initial_scale=0.5\).*VisionTransformer accepts only 32x32 inputs"
    with pytest.raises(ValueError, match=refusal):
        Trainer(
            _tiny_vit(),
            TensorLoader((images, labels), 4, seed=0),
            max_duration="2ba",
            optimizer=sgd(0.05),
            algorithms=[ProgressiveResizing()],
            compile="eager",
            progress_bar=False,
        ).fit()


def test_fixed_input_sizes_are_read_from_what_the_models_declare() -> None:
    assert fixed_input_size(_tiny_vit()) == ("", (32, 32))
    assert fixed_input_size(SmallCNN(in_channels=3, num_classes=4, width=4)) is None
    timm = pytest.importorskip("timm")
    kwargs = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=4)
    strict = timm.models.vision_transformer.VisionTransformer(**kwargs)
    assert fixed_input_size(strict) == ("patch_embed", (32, 32))
    assert fixed_input_size(timm.models.vision_transformer.VisionTransformer(dynamic_img_size=True, **kwargs)) is None


def test_mixed_dense_targets_average_over_the_labelled_positions_not_the_ignored_ones() -> None:
    # A band of positions ignored in every sample adds nothing: the loss equals the one on the map without it
    # (before, it was scaled down by the band's share of the map).
    images = R.uniform(R.key(0), (4, 1, 6, 8))
    targets = R.randint(R.key(1), 0, 3, (4, 6, 8))
    targets[:, :, 5:] = -100
    targets[1, 0, :2] = -100
    logits = R.normal(R.key(2), (4, 3, 6, 8))
    mixing = MixUp(alpha=1.0)
    _, pairing = mixing.mix_inputs(R.key(3), images, torch.tensor(0.3))

    def loss(width: int) -> torch.Tensor:
        batch = (images[..., :width], targets[..., :width])
        ctx = _ctx(batch, logits[..., :width]).with_scratch(mixing.name, pairing)
        _, ctx = mixing._mix_targets(_STATE, ctx)
        return F.cross_entropy(logits[..., :width], ctx.batch[1])

    torch.testing.assert_close(loss(8), loss(5))
    # Without an ignored label the targets are those of before, bitwise: the factor is exactly 1.
    clean = (images, targets.clamp(min=0))
    _, ctx = mixing._mix_targets(_STATE, _ctx(clean, logits).with_scratch(mixing.name, pairing))
    assert torch.equal(ctx.batch[1], mixing.mix_targets(clean[1], images, pairing, 3))
