"""The options every peer driver (bench/peer_*.py) takes from bench/peers.py, in one place."""

from __future__ import annotations

import argparse


def peer_parser(description: str) -> argparse.ArgumentParser:
    """ROOT (train/ and val/ class folders), --size, --epochs, --seed and --workers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("root")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    return parser
