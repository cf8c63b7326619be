"""Minari: datasets read into and written from stored tables (``datasets.py``), and how their
episodes map onto emote's columns and spaces (``layout.py``)."""
