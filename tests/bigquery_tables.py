"""Tables with the names and columns of the public datasets BigQuery ML's tutorials read,
generated here (nothing is downloaded): ``create(con)`` makes them on a DuckDB connection.

A BigQuery ``project.dataset.table`` is the DuckDB table ``dataset.table`` (dbml's BigQuery
translation drops the project), so ``bigquery-public-data.ml_datasets.penguins`` is
``ml_datasets.penguins``. Values are deterministic (hashes of the row number), shaped so the
tutorials' models have something to learn: penguins' body mass grows with flipper length and
differs by species and sex, census income with education and hours, and so on.
"""

from __future__ import annotations

# the datasets the tutorials create in the console before their first statement
TUTORIAL_DATASETS = ("bqml_tutorial", "census", "mydataset")


def _u(k: int) -> str:
    """A uniform number in [0, 1) per row ``i`` and stream ``k``."""
    return f"((hash(i, {k}) % 1000003) / 1000003.0)"


def _n(k: int) -> str:
    """An approximately standard normal number per row (sum of four uniforms)."""
    return f"(({_u(k)} + {_u(k + 100)} + {_u(k + 200)} + {_u(k + 300)} - 2.0) * 1.732)"


PENGUINS = f"""
CREATE TABLE ml_datasets.penguins AS
WITH r AS (SELECT range AS i, range % 3 AS s FROM range(344)),
v AS (SELECT i, s, ['Adelie Penguin (Pygoscelis adeliae)', 'Chinstrap penguin (Pygoscelis antarctica)',
                    'Gentoo penguin (Pygoscelis papua)'][s + 1] AS species,
             CASE WHEN s = 2 THEN 'Biscoe' WHEN s = 1 THEN 'Dream' ELSE ['Biscoe', 'Dream', 'Torgersen'][(i % 3) + 1] END AS island,
             CASE WHEN i % 29 = 5 THEN NULL WHEN i % 2 = 0 THEN 'MALE' ELSE 'FEMALE' END AS sex,
             {_n(1)} AS z1, {_n(2)} AS z2, {_n(3)} AS z3, {_n(4)} AS z4 FROM r)
SELECT species, island,
       CASE WHEN i IN (3, 271) THEN NULL ELSE round([38.8, 48.8, 47.5][s + 1] + 2.5 * z1, 1) END AS culmen_length_mm,
       CASE WHEN i IN (3, 271) THEN NULL ELSE round([18.3, 18.4, 15.0][s + 1] + 1.0 * z2, 1) END AS culmen_depth_mm,
       CASE WHEN i IN (3, 271) THEN NULL ELSE round([190.0, 196.0, 217.0][s + 1] + 6.0 * z3, 0) END AS flipper_length_mm,
       CASE WHEN i IN (3, 271) THEN NULL
            ELSE round([3700.0, 3730.0, 5070.0][s + 1] + 30.0 * ([190.0, 196.0, 217.0][s + 1] + 6.0 * z3 - [190.0, 196.0, 217.0][s + 1])
                       + CASE sex WHEN 'MALE' THEN 300 WHEN 'FEMALE' THEN -300 ELSE 0 END + 150 * z4, 0) END AS body_mass_g,
       sex
FROM v"""

CENSUS = f"""
CREATE TABLE ml_datasets.census_adult_income AS
WITH v AS (SELECT range AS i, {_u(1)} AS u1, {_u(2)} AS u2, {_u(3)} AS u3, {_n(4)} AS z FROM range(2000))
SELECT CAST(18 + floor(u1 * 50) AS BIGINT) AS age,
       ['Private', 'Self-emp-not-inc', 'Local-gov', 'State-gov', 'Self-emp-inc'][1 + CAST(floor(u2 * 5) AS INTEGER)] AS workclass,
       CAST(20000 + hash(i, 9) % 400000 AS BIGINT) AS functional_weight,
       ['HS-grad', 'Some-college', 'Bachelors', 'Masters', 'Doctorate'][1 + CAST(floor(u3 * 5) AS INTEGER)] AS education,
       CAST(9 + floor(u3 * 5) * 2 AS BIGINT) AS education_num,
       ['Never-married', 'Married-civ-spouse', 'Divorced'][1 + CAST(i % 3 AS INTEGER)] AS marital_status,
       ['Adm-clerical', 'Exec-managerial', 'Craft-repair', 'Prof-specialty', 'Sales', 'Tech-support'][1 + CAST(hash(i, 10) % 6 AS INTEGER)] AS occupation,
       ['Husband', 'Wife', 'Own-child', 'Not-in-family'][1 + CAST(hash(i, 11) % 4 AS INTEGER)] AS relationship,
       ['White', 'Black', 'Asian-Pac-Islander', 'Other'][1 + CAST(hash(i, 12) % 4 AS INTEGER)] AS race,
       CASE WHEN i % 2 = 0 THEN 'Male' ELSE 'Female' END AS sex,
       CAST(CASE WHEN hash(i, 13) % 10 = 0 THEN hash(i, 14) % 20000 ELSE 0 END AS BIGINT) AS capital_gain,
       CAST(0 AS BIGINT) AS capital_loss,
       CAST(20 + floor({_u(5)} * 40) AS BIGINT) AS hours_per_week,
       ['United-States', 'Mexico', 'India', 'Germany'][1 + CAST(hash(i, 15) % 4 AS INTEGER)] AS native_country,
       CASE WHEN 0.9 * u3 + 0.5 * u1 + 0.4 * {_u(5)} + 0.3 * (i % 3 = 1)::INTEGER + 0.25 * z > 1.15
            THEN '>50K' ELSE '<=50K' END AS income_bracket
FROM v"""

NATALITY = f"""
CREATE TABLE samples.natality AS
WITH v AS (SELECT range AS i, {_u(1)} AS u1, {_u(2)} AS u2, {_n(3)} AS z FROM range(300000))
SELECT CAST(1969 + i % 40 AS BIGINT) AS source_year, CAST(1969 + i % 40 AS BIGINT) AS year,
       CAST(1 + i % 12 AS BIGINT) AS month,
       ['WY', 'CA', 'TX', 'NY', 'OH', 'WA'][1 + CAST(hash(i, 4) % 6 AS INTEGER)] AS state,
       i % 2 = 0 AS is_male, CAST(1 + hash(i, 5) % 3 AS BIGINT) AS child_race,
       CASE WHEN i % 97 = 0 THEN NULL
            ELSE round(7.3 + 0.25 * (i % 2 = 0)::INTEGER + 0.3 * (CAST(36 + floor(u2 * 7) AS INTEGER) - 39)
                       + 0.01 * (CAST(16 + floor(u1 * 28) AS INTEGER) - 28) + 0.8 * z, 3) END AS weight_pounds,
       CAST(1 AS BIGINT) AS plurality,
       CAST(16 + floor(u1 * 28) AS BIGINT) AS mother_age,
       CAST(1 + hash(i, 6) % 4 AS BIGINT) AS mother_race,
       CAST(36 + floor(u2 * 7) AS BIGINT) AS gestation_weeks
FROM v"""

CYCLE_STATIONS = f"""
CREATE TABLE london_bicycles.cycle_stations AS
SELECT range AS id,
       CASE WHEN range % 10 = 3 THEN 'Kennington Road ' || range::VARCHAR ELSE 'Station ' || range::VARCHAR END AS name,
       51.45 + (hash(range, 1) % 1000) / 10000.0 AS latitude,
       -0.2 + (hash(range, 2) % 2000) / 10000.0 AS longitude
FROM range(1, 61)"""

CYCLE_HIRE = f"""
CREATE TABLE london_bicycles.cycle_hire AS
WITH v AS (SELECT range AS i FROM range(6000))
SELECT i AS rental_id, CAST(300 + hash(i, 1) % 3000 AS BIGINT) AS duration,
       CAST(1 + hash(i, 2) % 60 AS BIGINT) AS start_station_id,
       s.name AS start_station_name,
       TIMESTAMP '2015-01-01 06:00:00' + to_minutes(CAST(hash(i, 3) % (365 * 24 * 60) AS BIGINT)) AS start_date,
       CAST(1 + hash(i, 4) % 60 AS BIGINT) AS end_station_id
FROM v JOIN london_bicycles.cycle_stations s ON s.id = 1 + hash(i, 2) % 60"""

TAXI = f"""
CREATE TABLE new_york_taxi_trips.tlc_yellow_trips_2018 AS
WITH v AS (SELECT range AS i, {_u(1)} AS u1, {_n(2)} AS z FROM range(1500))
SELECT CAST(1 + i % 2 AS VARCHAR) AS vendor_id,
       TIMESTAMP '2018-01-01' + to_minutes(CAST(hash(i, 3) % 500000 AS BIGINT)) AS pickup_datetime,
       TIMESTAMP '2018-01-01' + to_minutes(CAST(hash(i, 3) % 500000 + 5 + floor(u1 * 40) AS BIGINT)) AS dropoff_datetime,
       CAST(1 + hash(i, 4) % 4 AS BIGINT) AS passenger_count,
       round(0.5 + u1 * 12, 2) AS trip_distance,
       '1' AS rate_code, 'N' AS store_and_fwd_flag,
       CAST(1 + hash(i, 5) % 2 AS VARCHAR) AS payment_type,
       round(3 + u1 * 12 * 2.5, 2) AS fare_amount, 0.5 AS extra, 0.5 AS mta_tax,
       CASE WHEN i % 50 = 0 THEN NULL ELSE greatest(round((3 + u1 * 30) * 0.18 + 0.4 * z, 2), 0) END AS tip_amount,
       0.0 AS tolls_amount, 0.3 AS imp_surcharge, round(4.3 + u1 * 30 * 1.18, 2) AS total_amount,
       CAST(1 + hash(i, 6) % 250 AS VARCHAR) AS pickup_location_id,
       CAST(1 + hash(i, 7) % 250 AS VARCHAR) AS dropoff_location_id
FROM v"""

MYTABLE = f"""
CREATE TABLE mydataset.mytable AS
WITH v AS (SELECT range AS i, {_n(1)} AS z1, {_n(2)} AS z2, {_n(3)} AS z3 FROM range(600))
SELECT round(z1, 4) AS column1, round(2 * z2 + z1, 4) AS column2,
       ['red', 'green', 'blue'][1 + CAST(i % 3 AS INTEGER)] AS column3,
       CAST(hash(i, 4) % 12 AS BIGINT) AS column4,
       CAST(z1 + 0.5 * z2 + 0.4 * (i % 3 = 0)::INTEGER + 0.5 * z3 > 0 AS BIGINT) AS label,
       CASE WHEN z1 > 0.5 THEN 'high' WHEN z1 > -0.5 THEN 'mid' ELSE 'low' END AS mylabel,
       TIMESTAMP '2024-01-01' + to_hours(i) AS timestamp
FROM v"""


def _ga_sessions(day: str) -> str:
    """One day's table of the Google Analytics sample, ``ga_sessions_<YYYYMMDD>``."""
    k = int(day)
    return f"""
CREATE TABLE google_analytics_sample.ga_sessions_{day} AS
WITH v AS (SELECT range AS i, {_u(k % 997)} AS u1, {_u(k % 991)} AS u2 FROM range(40))
SELECT CAST(hash(i, {k}) % 5000 AS VARCHAR) AS fullVisitorId, CAST(i AS BIGINT) AS visitId, '{day}' AS date,
       {{'visits': 1, 'pageviews': CASE WHEN i % 13 = 0 THEN NULL ELSE CAST(1 + floor(u1 * 30) AS BIGINT) END,
        'transactions': CASE WHEN u1 * 0.7 + u2 * 0.3 > 0.75 THEN 1 ELSE NULL END}} AS totals,
       {{'operatingSystem': CASE WHEN i % 17 = 0 THEN NULL ELSE ['Windows', 'Macintosh', 'Android', 'iOS', 'Linux'][1 + CAST(hash(i, {k} + 1) % 5 AS INTEGER)] END,
        'isMobile': hash(i, {k} + 1) % 5 >= 2, 'browser': 'Chrome'}} AS device,
       {{'country': CASE WHEN i % 19 = 0 THEN NULL ELSE ['United States', 'India', 'Canada', 'Germany', 'Japan'][1 + CAST(hash(i, {k} + 2) % 5 AS INTEGER)] END,
        'continent': 'Americas'}} AS geoNetwork
FROM v"""


def ga_days() -> list[str]:
    """The days with a ga_sessions table: every tenth day from 2016-08-01 to 2017-08-01."""
    import datetime
    start, end = datetime.date(2016, 8, 1), datetime.date(2017, 8, 1)
    return [(start + datetime.timedelta(days=d)).strftime("%Y%m%d") for d in range(0, (end - start).days + 1, 10)]


def create(con) -> None:
    """Every public table the corpus reads, and the tutorials' own datasets (schemas)."""
    for schema in ("ml_datasets", "samples", "google_analytics_sample", "london_bicycles",
                   "new_york_taxi_trips", *TUTORIAL_DATASETS):
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    for sql in (PENGUINS, CENSUS, NATALITY, CYCLE_STATIONS, CYCLE_HIRE, TAXI, MYTABLE):
        con.execute(sql)
    for day in ga_days():
        con.execute(_ga_sessions(day))
