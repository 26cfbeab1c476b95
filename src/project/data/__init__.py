"""Data: the file index, decoding, uint8 transforms, the embedded data set and the data module."""

from project.data.datamodule import ImageDataModule

__all__ = ["ImageDataModule"]
