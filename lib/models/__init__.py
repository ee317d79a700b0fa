"""Model families of the course, one file each (``lib.models.seq2seq``, ...).

Import the module you need explicitly, e.g. ``from lib.models import seq2seq``.
"""
