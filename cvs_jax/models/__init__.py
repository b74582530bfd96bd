"""Model zoo: ResNet and ViT embedding networks (``networks`` builds them from a config), the heads
and their classification loss, and pretrained weights."""
