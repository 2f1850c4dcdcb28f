"""init_parameters: keyed, pure, and distributed like PyTorch's default initialisation."""

import math

import pytest
import torch
from torch import nn

from composer_fn.core.random import fold_in, key
from composer_fn.models import MLP, SmallCNN, init_parameters


class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, kernel_size=5, bias=True)
        self.norm = nn.LayerNorm(16)
        self.embedding = nn.Embedding(50, 16, padding_idx=0)
        self.linear = nn.Linear(400, 300)
        self.scale = nn.Parameter(torch.full((4,), 2.5))


def test_names_match_named_parameters_and_shapes_and_dtypes_match_the_module() -> None:
    model = SmallCNN()
    values = init_parameters(model, key(0))
    parameters = dict(model.named_parameters())
    assert list(values) == list(parameters)
    for name, value in values.items():
        assert value.shape == parameters[name].shape and value.dtype == parameters[name].dtype
        assert value.data_ptr() != parameters[name].data_ptr()


def test_same_key_gives_bitwise_the_same_values_and_another_key_differs() -> None:
    model = _Mixed()
    first, second = init_parameters(model, key(3)), init_parameters(model, key(3))
    other = init_parameters(model, fold_in(key(3), 1))
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["linear.weight"], other["linear.weight"])


def test_each_parameter_is_drawn_from_its_own_named_key() -> None:
    # Adding a layer leaves the draws of the layers that keep their names unchanged.
    shallow = init_parameters(MLP(64, 10, (32,)), key(1))
    deep = init_parameters(MLP(64, 10, (32, 16)), key(1))
    assert torch.equal(shallow["1.weight"], deep["1.weight"])
    assert torch.equal(shallow["1.bias"], deep["1.bias"])
    assert not torch.equal(shallow["1.weight"][:16, :16], shallow["1.weight"][16:, :16])


def test_module_and_global_random_state_are_untouched() -> None:
    model = _Mixed()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng_before = torch.random.get_rng_state()
    init_parameters(model, key(2))
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    assert torch.equal(torch.random.get_rng_state(), rng_before)


def test_weights_and_biases_lie_within_pytorch_default_bounds_and_fill_them() -> None:
    model = _Mixed()
    values = init_parameters(model, key(4))
    for prefix, fan_in in (("conv", 3 * 5 * 5), ("linear", 400)):
        weight_bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + 5)) / math.sqrt(fan_in)
        bias_bound = 1.0 / math.sqrt(fan_in)
        weight, bias = values[f"{prefix}.weight"], values[f"{prefix}.bias"]
        assert weight.abs().max().item() <= weight_bound
        assert bias.abs().max().item() <= bias_bound
        # Uniform on [-b, b]: mean 0, variance b**2 / 3, and the extremes close to the bounds.
        assert abs(weight.mean().item()) < 0.05 * weight_bound
        assert weight.var().item() == pytest.approx(weight_bound**2 / 3, rel=0.05)
        assert weight.abs().max().item() > 0.99 * weight_bound
        assert bias.abs().max().item() > 0.8 * bias_bound


def test_norms_start_at_identity_embeddings_are_standard_normal_and_others_are_cloned() -> None:
    model = _Mixed()
    values = init_parameters(model, key(5))
    assert torch.equal(values["norm.weight"], torch.ones(16))
    assert torch.equal(values["norm.bias"], torch.zeros(16))
    embedding = values["embedding.weight"]
    assert torch.equal(embedding[0], torch.zeros(16))
    assert abs(embedding[1:].mean().item()) < 0.1 and embedding[1:].std().item() == pytest.approx(
        1.0, rel=0.1
    )
    assert torch.equal(values["scale"], model.scale.detach())
    assert values["scale"].data_ptr() != model.scale.data_ptr()


def test_batchnorm_parameters_start_at_identity() -> None:
    values = init_parameters(SmallCNN(width=8), key(6))
    assert torch.equal(values["features.0.1.weight"], torch.ones(8))
    assert torch.equal(values["features.0.1.bias"], torch.zeros(8))


def test_the_values_load_into_the_module() -> None:
    model = MLP(8, 3, (4,))
    values = init_parameters(model, key(7))
    model.load_state_dict(values, strict=False)
    assert all(torch.equal(p, values[name]) for name, p in model.named_parameters())


def test_invalid_arguments_raise() -> None:
    with pytest.raises(TypeError, match="module"):
        init_parameters("model", key(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="key"):
        init_parameters(MLP(4, 2), torch.zeros(3, dtype=torch.int64))
