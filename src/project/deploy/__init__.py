"""The deployment side: what runs an exported model, without torch or lightning.

`infer` (a folder of images to a CSV) and `serve` (an HTTP service with dynamic batching), which both
answer through `classifier` (an export loaded with its sidecar and checked), the
predictions CSV they and `predict` share (`prediction_csv`) and the probabilities of the logits
(`outputs`, numpy only).
The calibration applied to logits is `calibration` (the temperature, numpy only).  # room: calibration
They read an export's ONNX file
and its JSON sidecar through onnxruntime, numpy and Pillow: `tests/test_conventions.py` checks that
nothing here imports torch or lightning. Writing the export needs torch and lives beside the training
code (`project.export`).
"""
