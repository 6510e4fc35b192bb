"""A stand-in for google-cloud-storage's Client, Bucket and Blob, holding objects in a dict, for the
calls serving.create_only makes. Its methods take the real ones' parameters
(tests/test_create_only.py compares the signatures) and raise the real exceptions; a create with
`if_generation_match=0` succeeds only when no object has the name, as Cloud Storage's does."""
from __future__ import annotations

from google.api_core.exceptions import NotFound, PreconditionFailed


class StubClient:
    def __init__(self):
        self.objects: dict[tuple[str, str], tuple[bytes, int]] = {}  # (bucket, name) -> (data, generation)
        self.generation = 0
        self.lose_next_answer = False  # the next upload is stored but answered with its retry's 412

    def bucket(self, bucket_name, user_project=None, generation=None):
        return StubBucket(self, bucket_name)


class StubBucket:
    def __init__(self, client: StubClient, name: str):
        self.client, self.name = client, name

    def blob(self, blob_name, chunk_size=None, encryption_key=None, kms_key_name=None, generation=None):
        return StubBlob(self, blob_name)


class StubBlob:
    def __init__(self, bucket: StubBucket, name: str):
        self.bucket, self.name = bucket, name

    @property
    def _key(self):
        return self.bucket.name, self.name

    def upload_from_string(self, data, content_type="text/plain", client=None, predefined_acl=None,
                           if_generation_match=None, if_generation_not_match=None, if_metageneration_match=None,
                           if_metageneration_not_match=None, timeout=60, checksum="auto", retry=None,
                           crc32c_checksum_value=None):
        store = self.bucket.client
        current = store.objects.get(self._key)
        if if_generation_match is not None and (current[1] if current else 0) != if_generation_match:
            raise PreconditionFailed(f"At least one of the pre-conditions you specified did not hold: {self.name}")
        store.generation += 1
        store.objects[self._key] = (data.encode() if isinstance(data, str) else data, store.generation)
        if store.lose_next_answer:
            store.lose_next_answer = False
            raise PreconditionFailed("the retry of an upload whose answer was lost")

    def download_as_bytes(self, client=None, start=None, end=None, raw_download=False, if_etag_match=None,
                          if_etag_not_match=None, if_generation_match=None, if_generation_not_match=None,
                          if_metageneration_match=None, if_metageneration_not_match=None, timeout=60,
                          checksum="auto", retry=None, single_shot_download=False):
        if self._key not in self.bucket.client.objects:
            raise NotFound(f"No such object: {self.bucket.name}/{self.name}")
        return self.bucket.client.objects[self._key][0]

    def delete(self, client=None, if_generation_match=None, if_generation_not_match=None,
               if_metageneration_match=None, if_metageneration_not_match=None, timeout=60, retry=None):
        if self.bucket.client.objects.pop(self._key, None) is None:
            raise NotFound(f"No such object: {self.bucket.name}/{self.name}")
