"""Data: the file index, decoding, uint8 transforms, the embedded data set and the data module.

Nothing is imported here, so that torch-free code (`project.deploy`) can use `project.data.index`.
"""
