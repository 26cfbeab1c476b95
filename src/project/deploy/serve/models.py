"""The model a service answers with, and swapping it for a new export without stopping.

`--model` may be a link such as `checkpoints/<run>/latest.onnx`: every (re)load resolves it to
the export it points at and reads that export's own sidecar (`<stem>.json`, not `latest.json`),
so a reload that falls between export repointing `latest.onnx` and `latest.json` still pairs a
model with its own class names. The version is the resolved file's stem: unique per export (it
carries the run, the score and the export time) and what `ls -l latest.onnx` shows.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from project.deploy.classifier import Classifier, kind_of
from project.errors import UserError


@dataclass(frozen=True)
class LoadedModel:
    classifier: Classifier
    version: str
    path: Path  # the resolved .onnx (or OpenVINO .xml)
    loaded_at: str


def load_model(
    model: Path,
    threads: int | None = None,
    unknown_accept: float | None = None,  # room: unknown
) -> LoadedModel:
    """Load and warm up the export `model` points at; UserError naming the file when it cannot."""
    resolved = model.resolve()
    if not resolved.is_file():
        what = f"links to '{resolved}', which" if model.is_symlink() else ""
        raise UserError(
            f"Model '{model}' {what} does not exist.".replace("  ", " "),
            "pass --model PATH to an .onnx (or .xml) written by `python -m project export`, "
            "or point the link at one.",
        )
    classifier = Classifier(
        resolved,
        threads,
        unknown_accept,  # room: unknown
    )
    named = classifier.sidecar.files.get(kind_of(resolved))
    if named is not None and named != resolved.name:
        raise UserError(
            f"Sidecar '{resolved.with_suffix('.json')}' describes '{named}', not '{resolved.name}'.",
            "keep each export's model files and .json together under the names export gave them.",
        )
    # Classifier has run the model once: warmed up, and its outputs checked against the class names
    return LoadedModel(classifier, resolved.stem, resolved, time.strftime("%Y-%m-%dT%H:%M:%S%z"))


class ModelSlot:
    """The model new requests get; `reload()` loads the next one beside it, then swaps the reference.

    Requests already preprocessed for the old model keep their reference to it and finish on it;
    it is freed when the last of them is answered.
    """

    def __init__(
        self,
        model: Path,
        threads: int | None = None,
        unknown_accept: float | None = None,  # room: unknown
    ) -> None:
        self.model = model
        self.options: dict = {"threads": threads}  # what each load of the model is given
        self.options["unknown_accept"] = unknown_accept  # room: unknown
        self.current = load_model(model, **self.options)
        self.reloads = 0
        self.failed_reloads = 0
        self._lock = asyncio.Lock()  # two reloads at once would load the same file twice

    @property
    def reloading(self) -> bool:
        return self._lock.locked()

    async def reload(self) -> tuple[LoadedModel, LoadedModel]:
        """(old, new) after loading `model` again; on any error the current model stays."""
        async with self._lock:
            try:  # in a thread: requests go on being answered by the current model meanwhile
                new = await asyncio.to_thread(load_model, self.model, **self.options)
            except Exception:  # a UserError, or anything unforeseen: counted all the same
                self.failed_reloads += 1
                raise
            old, self.current = self.current, new
            self.reloads += 1
            return old, new
