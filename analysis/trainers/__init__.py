"""What the runs show about real trainers' rules: the trainers table."""
