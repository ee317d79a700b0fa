"""``python -m tools.pretrain``: see the package's docstring."""
from tools.pretrain import main

main()
