"""What a person reads after runs: plots, the paper's numbers beside ours."""
