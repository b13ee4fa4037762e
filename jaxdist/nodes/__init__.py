"""Node types: each module here is one kind of node that plugs into the program model."""
