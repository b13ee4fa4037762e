"""What a run leaves behind for people to read: metrics as CSV (``metrics``), TensorBoard
events (``metrics_tensorboard``) and learning curves (``plotting``)."""
