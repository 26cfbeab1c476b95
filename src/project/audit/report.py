"""The audit's files: four CSVs, a self-contained report.html of thumbnails, the keep list, the summary."""

from __future__ import annotations

import base64
import csv
import html
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from project.atomic import atomic_folder, atomic_write
from project.audit.duplicates import Pair
from project.audit.folds import FoldOutputs
from project.audit.images import AuditImages
from project.audit.labels import LabelIssues
from project.csv_cells import spreadsheet_cell
from project.data.index import ImageIndex
from project.data.skipped import SkipLog

THUMB = 112
# The fold models count as near chance below this share of the way from chance accuracy to perfect:
# their out-of-fold probabilities then rank labels by little more than noise.
NEAR_CHANCE = 0.2


@dataclass
class Findings:
    """Everything an audit found; rows of `good` are positions in `index` (the readable images)."""

    index: ImageIndex
    split_of: np.ndarray
    good: np.ndarray
    images: AuditImages
    outputs: FoldOutputs
    issues: LabelIssues
    pairs: list[Pair]
    outlier_percentile: np.ndarray
    outlier_limit: float
    top: int
    seconds: float

    def file(self, row: int) -> str:
        """The file of readable image `row`, relative to the data root."""
        return os.fsdecode(self.index.paths[self.good[row]])

    def given(self, row: int) -> list[int]:
        label = self.index.labels[self.good[row]]
        return np.flatnonzero(label).tolist() if label.ndim else [int(label)]

    def names(self, classes: list[int]) -> str:
        return " ".join(self.index.class_names[c] for c in classes)

    @property
    def outliers(self) -> np.ndarray:
        """Rows flagged as outliers, least typical first."""
        rows = np.flatnonzero(self.outlier_percentile < self.outlier_limit)
        return rows[np.argsort(self.outlier_percentile[rows], kind="stable")]

    @property
    def oof_accuracy(self) -> float:
        labels = self.index.labels[self.good]
        probs = self.outputs.probabilities
        # room: multilabel begin
        if labels.ndim == 2:
            return float(((probs >= 0.5) == labels.astype(bool)).mean())
        # room: multilabel end
        return float((probs.argmax(axis=1) == labels).mean())

    @property
    def chance_accuracy(self) -> float:
        """The accuracy of always answering the largest class.
        # room: multilabel begin
        For multi-label data, each label's majority.
        # room: multilabel end
        """
        labels = self.index.labels[self.good]
        # room: multilabel begin
        if labels.ndim == 2:
            rate = labels.astype(bool).mean(axis=0)
            return float(np.maximum(rate, 1 - rate).mean())
        # room: multilabel end
        return float(np.bincount(labels).max() / len(labels))

    @property
    def chance_warning(self) -> str | None:
        """A warning when the fold models are near chance, else None."""
        return chance_warning(self.oof_accuracy, self.chance_accuracy)


def chance_warning(accuracy: float, chance: float) -> str | None:
    """Why the findings mean little, when `accuracy` is less than NEAR_CHANCE of the way from `chance`
    to 1; None otherwise."""
    if accuracy >= chance + NEAR_CHANCE * (1 - chance):
        return None
    return (
        f"the fold models are near chance (out-of-fold accuracy {accuracy:.3f}, against {chance:.3f} for "
        "always answering the largest class): the label issues and outliers rank little more than noise. "
        "Fix: train the folds longer (--epochs), start from pretrained weights (--model.weights=DEFAULT), "
        "or check that the images show their classes."
    )


def _csv(header: list[str], rows: list[list[object]]) -> bytes:
    """A CSV with the predictions CSV's rules: names are never spreadsheet formulas, any name's bytes kept."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    # numbers are written as non-negative decimals, so only names (files, labels) can change here
    writer.writerows([spreadsheet_cell(c) if isinstance(c, str) else c for c in row] for row in rows)
    return buffer.getvalue().encode("utf-8", "surrogateescape")


def label_issue_rows(f: Findings) -> list[list[object]]:
    rows = []
    for rank, row in enumerate(f.issues.ranked, 1):
        given, suggested = f.given(row), f.issues.suggested[row]
        p = f.outputs.probabilities[row]
        rows.append(
            [rank, f.file(row), f.split_of[f.good[row]], f.names(given), f.names(suggested),
             f"{f.issues.quality[row]:.6f}", f"{p[given].mean() if given else 0:.6f}",
             f"{p[suggested].mean() if suggested else 0:.6f}"]
        )  # fmt: skip
    return rows


def duplicate_rows(f: Findings) -> list[list[object]]:
    return [
        [f.file(p.a), f.file(p.b), f"{p.similarity:.6f}", p.kind, str(p.leak).lower(),
         f.split_of[f.good[p.a]], f.split_of[f.good[p.b]], f.names(f.given(p.a)), f.names(f.given(p.b)),
         p.hash_distance, f"{p.color_distance:.2f}"]
        for p in f.pairs
    ]  # fmt: skip


def outlier_rows(f: Findings) -> list[list[object]]:
    probs = f.outputs.probabilities
    return [
        [rank, f.file(row), f.split_of[f.good[row]], f.names(f.given(row)),
         f"{f.outlier_percentile[row]:.6f}", f"{probs[row].max():.6f}"]
        for rank, row in enumerate(f.outliers, 1)
    ]  # fmt: skip


def probability_rows(f: Findings) -> list[list[object]]:
    return [
        [f.file(row), f.split_of[f.good[row]], f.names(f.given(row)), int(f.outputs.fold_of[row]),
         f"{f.issues.quality[row]:.6f}", *(f"{v:.6f}" for v in f.outputs.probabilities[row])]
        for row in range(len(f.good))
    ]  # fmt: skip


def write_findings(f: Findings, out: Path) -> None:
    """All files of the audit, into `out` at once (a half-written audit folder never appears)."""
    classes = list(f.index.class_names)
    with atomic_folder(out) as staging:
        files = {
            "label_issues.csv": _csv(
                ["rank", "file", "split", "given_label", "suggested_label", "label_quality",
                 "p_given", "p_suggested"], label_issue_rows(f)),
            "duplicates.csv": _csv(
                ["file_a", "file_b", "similarity", "kind", "leak", "split_a", "split_b", "label_a",
                 "label_b", "hash_distance", "color_distance"], duplicate_rows(f)),
            "outliers.csv": _csv(
                ["rank", "file", "split", "label", "typicality_percentile", "max_probability"],
                outlier_rows(f)),
            "oof_probabilities.csv": _csv(
                ["file", "split", "label", "fold", "label_quality", *(f"p_{c}" for c in classes)],
                probability_rows(f)),
            "report.html": render_html(f).encode("utf-8", "surrogateescape"),
        }  # fmt: skip
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)  # a folder like any other in logs/, not mkdtemp's private 0700
        for name, data in files.items():
            atomic_write(staging / name, data)
        if f.images.bad:
            log = SkipLog(staging)  # the same list, in the same format, as fit's skipped_files.txt
            for position, reason in sorted(f.images.bad.items()):
                log.add(f.index.path(position), reason)
            log.merge()


def clean_files(f: Findings) -> list[str]:
    """Readable files that no finding flags, keeping one file of each duplicate group (in val/test first)."""
    drop = set(f.issues.ranked.tolist()) | set(f.outliers.tolist())
    evaluation = ("val", "test")
    for p in f.pairs:
        if p.a in drop or p.b in drop:
            continue
        # the copy in training goes: the evaluation split keeps its image, and the leak closes
        a_eval = f.split_of[f.good[p.a]] in evaluation
        drop.add(p.a if not a_eval and f.split_of[f.good[p.b]] in evaluation else p.b)
    return [f.file(row) for row in range(len(f.good)) if row not in drop]


def write_clean_list(f: Findings, dest: Path) -> None:
    keep = clean_files(f)
    atomic_write(dest, "".join(name + "\n" for name in keep).encode("utf-8", "surrogateescape"))


def summary(f: Findings, out: Path, clean: Path | None) -> str:
    leaks = sum(p.leak for p in f.pairs)
    exact = sum(p.kind == "exact" for p in f.pairs)
    lines = [
        f"Audited {len(f.good):,} images in {f.seconds:.0f} s (out-of-fold accuracy {f.oof_accuracy:.3f}):",
        f"  label issues  {len(f.issues.ranked):6,}   {out / 'label_issues.csv'}",
        f"  duplicates    {len(f.pairs):6,}   pairs ({exact} exact, {leaks} across splits: leaks)  "
        f"{out / 'duplicates.csv'}",
        f"  outliers      {len(f.outliers):6,}   {out / 'outliers.csv'}",
        f"  probabilities {len(f.good):6,}   {out / 'oof_probabilities.csv'}",
    ]
    if f.images.bad:
        lines.append(
            f"  unreadable    {len(f.images.bad):6,}   skipped, listed in {out / 'skipped_files.txt'}"
        )
    if clean is not None:
        lines.append(f"  files to keep {len(clean_files(f)):6,}   {clean} (nothing was moved or deleted)")
    lines.append(f"Review the top findings side by side: {out / 'report.html'}")
    if f.chance_warning is not None:
        lines.append(f"Warning: {f.chance_warning}")
    return "\n".join(lines)


# ---- report.html ----


def thumbnail(f: Findings, row: int) -> str:
    """An <img> of readable image `row`, inline as a JPEG data URI: the report is one portable file."""
    image = f.images.decoded.image(int(f.good[row]))
    pil = Image.fromarray(image.permute(1, 2, 0).numpy())
    pil.thumbnail((THUMB, THUMB))
    buffer = io.BytesIO()
    pil.save(buffer, format="JPEG", quality=85)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/jpeg;base64,{data}" alt="">'


def _card(f: Findings, row: int, caption: str) -> str:
    name = html.escape(f.file(row))
    return f'<figure>{thumbnail(f, row)}<figcaption title="{name}">{name}<br>{caption}</figcaption></figure>'


def render_html(f: Findings) -> str:
    e = html.escape
    parts = [
        "<!doctype html><meta charset='utf-8'><title>Data audit</title><style>"
        "body{font-family:sans-serif;margin:1.5em}figure{display:inline-block;margin:4px;width:"
        f"{THUMB + 8}px;vertical-align:top}}figcaption{{font-size:11px;overflow-wrap:anywhere}}"
        ".pair{display:inline-block;border:1px solid #ccc;margin:4px;padding:2px}.leak{border-color:#c00}"
        "b.bad{color:#c00}</style>",
        f"<h1>Data audit</h1><p>{len(f.good):,} images, out-of-fold accuracy {f.oof_accuracy:.3f}. "
        "The tool ranks; a person decides. Nothing in the data folder was changed.</p>",
        f"<p><b class=bad>Warning: {e(f.chance_warning)}</b></p>" if f.chance_warning else "",
        f"<h2>Label issues ({len(f.issues.ranked):,}; top {min(f.top, len(f.issues.ranked))})</h2>",
    ]
    for row in f.issues.ranked[: f.top]:
        caption = (
            f"given <b class='bad'>{e(f.names(f.given(row)))}</b><br>suggested "
            f"<b>{e(f.names(f.issues.suggested[row]))}</b><br>quality {f.issues.quality[row]:.2g}"
        )
        parts.append(_card(f, row, caption))
    parts.append(f"<h2>Duplicates ({len(f.pairs):,} pairs; top {min(f.top, len(f.pairs))})</h2>")
    for p in f.pairs[: f.top]:
        cls = "pair leak" if p.leak else "pair"
        note = "LEAK " if p.leak else ""
        cards = "".join(
            _card(f, row, f"{e(f.split_of[f.good[row]])} / {e(f.names(f.given(row)))}") for row in (p.a, p.b)
        )
        parts.append(
            f"<div class='{cls}'>{cards}<br><small>{note}{p.kind}, similarity {p.similarity:.3f}, "
            f"hash distance {p.hash_distance}, colour distance {p.color_distance:.1f}</small></div>"
        )
    outliers = f.outliers
    parts.append(f"<h2>Outliers ({len(outliers):,}; top {min(f.top, len(outliers))})</h2>")
    for row in outliers[: f.top]:
        caption = f"{e(f.names(f.given(row)))}<br>typicality {f.outlier_percentile[row]:.3f}"
        parts.append(_card(f, row, caption))
    if f.images.bad:
        parts.append(f"<h2>Unreadable files ({len(f.images.bad)}), skipped</h2><ul>")
        for position, reason in sorted(f.images.bad.items()):
            parts.append(f"<li>{e(os.fsdecode(f.index.paths[position]))}: {e(reason)}</li>")
        parts.append("</ul>")
    return "\n".join(parts)
