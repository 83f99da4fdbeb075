-- The schema of gradwatch 0.1 (server/db.py at 29e8a71) as PostgreSQL DDL, for the migration test.

CREATE TABLE points (
	key_id INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	wall_time FLOAT NOT NULL, 
	value FLOAT
);

CREATE INDEX ix_points_key_step ON points (key_id, step);

CREATE TABLE rollups (
	key_id INTEGER NOT NULL, 
	level INTEGER NOT NULL, 
	block INTEGER NOT NULL, 
	n INTEGER NOT NULL, 
	data BYTEA NOT NULL, 
	CONSTRAINT uq_rollups_key_level_block UNIQUE (key_id, level, block)
);

CREATE TABLE runs (
	id SERIAL NOT NULL, 
	uid VARCHAR(64) NOT NULL, 
	project VARCHAR(200) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	created_at FLOAT NOT NULL, 
	updated_at FLOAT NOT NULL, 
	finished_at FLOAT, 
	last_step INTEGER, 
	last_seq INTEGER NOT NULL, 
	config TEXT NOT NULL, 
	meta TEXT NOT NULL, 
	alert_config TEXT NOT NULL, 
	tags TEXT NOT NULL, 
	notes TEXT NOT NULL, 
	error TEXT, 
	PRIMARY KEY (id), 
	UNIQUE (uid)
);

CREATE INDEX ix_runs_project ON runs (project);

CREATE TABLE vectors (
	key_id INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	wall_time FLOAT NOT NULL, 
	data BYTEA NOT NULL, 
	missing TEXT
);

CREATE INDEX ix_vectors_key_step ON vectors (key_id, step);

CREATE TABLE alerts (
	id SERIAL NOT NULL, 
	run_id INTEGER NOT NULL, 
	kind VARCHAR(40) NOT NULL, 
	step INTEGER, 
	key VARCHAR(256), 
	layer VARCHAR(256), 
	value FLOAT, 
	severity VARCHAR(16) NOT NULL, 
	message TEXT NOT NULL, 
	created_at FLOAT NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE INDEX ix_alerts_run_id ON alerts (run_id);

CREATE TABLE metric_keys (
	id SERIAL NOT NULL, 
	run_id INTEGER NOT NULL, 
	key VARCHAR(256) NOT NULL, 
	layers TEXT, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_metric_keys_run_key UNIQUE (run_id, key), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);
