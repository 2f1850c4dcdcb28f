"""Data: the embedded digits task, keyed synthetic images, readers of image data sets on disk, and loaders."""

from composer_fn.data.cifar import load_cifar_task
from composer_fn.data.datasets import DATASETS, load_dataset
from composer_fn.data.digits import DigitsTask, load_digits_task
from composer_fn.data.folder import FolderLoader, FolderTask, UnreadableImage, load_image_folder_task
from composer_fn.data.idx import load_idx_task, read_idx, write_idx
from composer_fn.data.images import DatasetNotFoundError, ImageTask
from composer_fn.data.loader import TensorLoader
from composer_fn.data.synthetic import synthetic_images

__all__ = [
    "DATASETS",
    "DatasetNotFoundError",
    "DigitsTask",
    "FolderLoader",
    "FolderTask",
    "ImageTask",
    "TensorLoader",
    "UnreadableImage",
    "load_cifar_task",
    "load_dataset",
    "load_digits_task",
    "load_idx_task",
    "load_image_folder_task",
    "read_idx",
    "synthetic_images",
    "write_idx",
]
