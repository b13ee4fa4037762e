"""One module per launcher, each with `launch(program, **options) -> Running`."""
