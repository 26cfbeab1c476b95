"""fastai's image classifier on train/ and val/ folders, as its documentation trains one; one line per epoch.

    python bench/peer_fastai.py ROOT --size 128 --epochs 12 --seed 0

Run by bench/peers.py in an environment with fastai (it is not a dependency of the project):
`vision_learner` with `resnet18` from scratch (`pretrained=False`: no weights can be downloaded here),
`aug_transforms` and `fit_one_cycle` at fastai's default learning rate (`fine_tune` is for pretrained
bodies). Prints `epoch N acc X` after each epoch.
"""

from __future__ import annotations

from fastai.callback.core import Callback
from fastai.callback.progress import ProgressCallback
from fastai.torch_core import set_seed
from fastai.vision.all import ImageDataLoaders, Resize, accuracy, aug_transforms, resnet18, vision_learner

from peer_args import peer_parser


class PrintEpoch(Callback):
    order = 100  # after the Recorder has the epoch's metrics

    def after_epoch(self) -> None:
        values = dict(zip(self.recorder.metric_names[1:], self.recorder.values[-1], strict=False))
        print(f"epoch {self.epoch + 1} acc {values['accuracy']:.4f}", flush=True)


def main() -> None:
    parser = peer_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    set_seed(args.seed, reproducible=False)
    loaders = ImageDataLoaders.from_folder(
        args.root,
        train="train",
        valid="val",
        item_tfms=Resize(args.size),
        batch_tfms=aug_transforms(size=args.size),
        bs=64,
        num_workers=args.workers,
        seed=args.seed,
    )
    learner = vision_learner(loaders, resnet18, pretrained=False, metrics=accuracy, cbs=[PrintEpoch()])
    learner.remove_cb(ProgressCallback)
    learner.fit_one_cycle(args.epochs)


if __name__ == "__main__":
    main()
