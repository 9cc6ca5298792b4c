"""What several test modules share, imported from here and never from another test module."""
