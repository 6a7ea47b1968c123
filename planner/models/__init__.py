"""Where models come from: the zoo, its Flax twins, ParaDL .net files, Flax extraction, and the one resolver of model names."""
