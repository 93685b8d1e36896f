"""One module or package per lab; a notebook cell is one call into here. The README's layout table lists them."""
