"""specdiff.tui: the command line and the Textual diff app."""
