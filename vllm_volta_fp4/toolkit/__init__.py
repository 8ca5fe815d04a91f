"""What the ``volta-fp4`` subcommands run: converter, doctor, memory planner, benchmark."""
