"""ParaDL's oracle for a whole model (planner.oracle) and its accuracy against ParaDL's measurements."""
