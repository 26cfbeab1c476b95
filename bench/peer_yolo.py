"""Ultralytics YOLO classification on train/ and val/ folders, the documented way; one line an epoch.

    python bench/peer_yolo.py ROOT --size 128 --epochs 12 --seed 0 --out DIR

Run by bench/peers.py in an environment with ultralytics (not a dependency of the project): the model
built from `yolo11n-cls.yaml` (from scratch: no weights can be downloaded here), then `model.train` on
the folder (what `yolo classify train data=ROOT model=yolo11n-cls.yaml` does) with its defaults, on
the CPU, plots off (they would fetch a font); `--hours` is its `time=` budget, which re-plans the
epochs to the pace measured as it trains. Prints `epoch N acc X` after each epoch's validation (and
`best.pt acc X` for its final one, of the checkpoint it selected on val).
"""

from __future__ import annotations

from typing import Any

from ultralytics import YOLO

from peer_args import peer_parser


def main() -> None:
    parser = peer_parser(__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--hours", type=float, default=0.0, help="time budget; re-plans epochs")
    args = parser.parse_args()
    model = YOLO("yolo11n-cls.yaml")

    def mark_final_eval(trainer: Any) -> None:
        """Its final validation of best.pt (selected on val) calls the epoch-end hook too: tell it apart."""
        final_eval = trainer.final_eval

        def marked() -> None:
            trainer.in_final_eval = True
            final_eval()

        trainer.final_eval = marked

    def print_epoch(trainer: Any) -> None:
        accuracy = trainer.metrics.get("metrics/accuracy_top1")
        if getattr(trainer, "in_final_eval", False):
            print(f"best.pt acc {accuracy:.4f}", flush=True)
        else:
            print(f"epoch {trainer.epoch + 1} acc {accuracy:.4f}", flush=True)

    model.add_callback("on_pretrain_routine_start", mark_final_eval)
    model.add_callback("on_fit_epoch_end", print_epoch)
    model.train(
        data=args.root,
        epochs=args.epochs,
        time=args.hours or None,
        imgsz=args.size,
        seed=args.seed,
        workers=args.workers,
        device="cpu",
        pretrained=False,
        plots=False,
        amp=False,
        save_dir=args.out,
        verbose=False,
    )


if __name__ == "__main__":
    main()
