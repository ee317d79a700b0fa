"""`lib`: the shared package every chapter of the course imports.

The modules follow the book: ``device`` (where am I running), ``config`` (the CI
and full recipes), ``data`` (real datasets), ``text`` (tokenizers), ``attention``,
``layers``, ``models``, ``train``, ``generate``, ``translation`` (the split and BLEU
of the translation chapters), ``checkpoints`` (the models the course pretrains itself,
by name), ``results`` and ``viz``.
Import submodules explicitly, e.g. ``from lib import device, train``.
"""

__version__ = "0.1.0"
