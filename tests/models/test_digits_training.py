"""SmallCNN learns the digits task in a few epochs of plain SGD, with keyed initialisation and shuffling."""

import torch
import torch.nn.functional as F

from composer_fn.core.random import key
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models import SmallCNN, init_parameters


def test_small_cnn_reaches_95_percent_heldout_accuracy_on_digits_in_five_epochs() -> None:
    task = load_digits_task()
    model = SmallCNN(in_channels=1, num_classes=task.num_classes)
    model.load_state_dict(init_parameters(model, key(0)), strict=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loader = TensorLoader(task.train, batch_size=64, seed=0)
    model.train()
    for epoch in range(5):
        loader.set_epoch(epoch)
        for images, labels in loader:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(task.heldout[0]).argmax(dim=1)
    accuracy = (predicted == task.heldout[1]).float().mean().item()
    assert accuracy >= 0.95, f"held-out accuracy {accuracy:.4f} < 0.95"
