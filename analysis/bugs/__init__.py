"""What the runs show about the trainers' known bugs (conf/bug/): the known-bugs table."""
