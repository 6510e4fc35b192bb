"""Data validation without TFDV: statistics, schema and anomalies as tensorflow-metadata protos,
stored where and how TFDV and the standard TFX components store them. No TFX in here."""
