"""`python -m project audit`: wrong labels, duplicates, leaks and outliers in a data set, ranked for a person.

command.py parses fit's options and runs the steps; images.py reads every file once (bytes hash,
perceptual hash, a small decoded copy); folds.py trains k models for out-of-fold probabilities and
embeddings; labels.py, duplicates.py and outliers.py turn those into findings; report.py writes them.
"""
