"""Synthetic tasks with a known optimum, and a character-level text loader.

MarkovLM     a seeded sparse Markov chain over tokens; its exact entropy rate is the optimum
             next-token loss (nats per token)
Teacher      regression onto a fixed random MLP; noise-free, so the optimum loss is 0
CharDataset  random windows of a character-encoded text
arrays       data you have (arrays, a token file, an iterator) as a batch(key, step)
"""

from fp4lab.data import arrays
from fp4lab.data.markov import MarkovLM
from fp4lab.data.teacher import Teacher
from fp4lab.data.text import CharDataset

__all__ = ["MarkovLM", "Teacher", "CharDataset", "arrays"]
