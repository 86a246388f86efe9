# code_small trained from scratch at 4L = 256 on the same tokens (16 rows of 256): reported beside the control and the
# ceiling, not as a control (sequence length changes how well a model this small trains per token).
out_dir, dataset = "out/code_native256", "sympy"
block_size, batch_size = 256, 16
