"""AMD's .xmodel files (XIR graphs compiled by vai_c): read, run, inspect and report them."""
