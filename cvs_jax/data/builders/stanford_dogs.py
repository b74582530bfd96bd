"""Stanford Dogs with 256x256 images (`stanford_dogs_256`), from TFDS's `stanford_dogs`.

Source: the standard TFDS dataset `stanford_dogs` (120 classes; train 12,000 /
test 8,580 images, the official lists), prepared in `data_dir` in the
array_record format by `tfds build stanford_dogs --data_dir=DIR
--file_format=array_record` on a machine with TensorFlow and internet.

Stored: every image once, resized (shorter side 256) and centre-cropped to
256x256 RGB (see `resize`), with the source's label ids and class names
(lowercased folder names such as `n02085620-chihuahua`). Order: sorted by the
source's `image/filename` (the path in the official images.tar, such as
`Images/n02085620-Chihuahua/n02085620_10074.jpg`), i.e. by class folder then
file name, which does not depend on how TFDS shuffled the records; `id` = position in that order and
line `id` of the store's `<split>.sources.txt` is the file name.
"""

from __future__ import annotations

from cvs_jax.data.builders._tfds_source import DerivedSource, Plan, SourceDescription, SourceSplit

SOURCE_NAME = "stanford_dogs"


class StanfordDogs256Source(DerivedSource):
    """All of TFDS's stanford_dogs, stored as 256x256 uint8 arrays (the TFDS half:
    ``tfds_builders.StanfordDogs256``)."""

    name = "stanford_dogs_256"
    SOURCE_NAME = SOURCE_NAME
    SOURCE_SPLITS = {"train": "train", "test": "test"}
    KEY_FEATURE = "image/filename"

    @classmethod
    def plan(cls, source: SourceDescription, splits: dict[str, SourceSplit]) -> Plan:
        records = {}
        for split, data in splits.items():
            order = sorted(range(len(data.keys)), key=lambda p: data.keys[p])
            records[split] = [(p, int(data.labels[p])) for p in order]
        return Plan(
            class_names=source.class_names,
            source_classes=tuple(range(len(source.class_names))),
            records=records,
        )
