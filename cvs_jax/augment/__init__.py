"""Image augmentation on the device: crops, flips and normalisation (``transforms``), AutoAugment and
RandAugment policies (``autoaugment``)."""
