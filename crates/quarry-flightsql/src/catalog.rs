//! What the server tells clients about itself: `GetSqlInfo` and `GetXdbcTypeInfo`.

use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder};
use arrow_flight::sql::{Nullable, Searchable, SqlInfo, SqlSupportedTransaction, XdbcDataType};

/// The catalog every table is in (DataFusion's default catalog of a Quarry session).
pub const CATALOG: &str = "quarry";
/// The schema the warehouse's tables are in.
pub const SCHEMA: &str = "main";

/// The server's answers to `GetSqlInfo`.
pub fn sql_info() -> SqlInfoData {
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "Quarry");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    // The Arrow format version of Schema.fbs.
    info.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
    // Tables change only through `quarry load` / `quarry gen`, which commit atomically.
    info.append(SqlInfo::FlightSqlServerReadOnly, true);
    info.append(SqlInfo::FlightSqlServerSql, true);
    info.append(SqlInfo::FlightSqlServerSubstrait, false);
    info.append(SqlInfo::FlightSqlServerTransaction, SqlSupportedTransaction::None as i32);
    info.append(SqlInfo::FlightSqlServerCancel, true);
    info.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    info.append(SqlInfo::SqlIdentifierCase, arrow_flight::sql::SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32);
    info.append(SqlInfo::SqlQuotedIdentifierCase, arrow_flight::sql::SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32);
    info.append(SqlInfo::SqlAllTablesAreSelectable, true);
    info.append(SqlInfo::SqlTransactionsSupported, false);
    info.build().expect("static SQL info builds")
}

/// The SQL types a query can return, for `GetXdbcTypeInfo`.
pub fn xdbc_type_info() -> XdbcTypeInfoData {
    let mut types = XdbcTypeInfoDataBuilder::new();
    let mut add = |name: &str, data_type: XdbcDataType, column_size: Option<i32>, prefix: Option<&str>, radix: Option<i32>| {
        types.append(XdbcTypeInfo {
            type_name: name.into(),
            data_type,
            column_size,
            literal_prefix: prefix.map(|p| format!("{p} '")),
            literal_suffix: prefix.map(|_| "'".into()),
            create_params: (name == "DECIMAL").then(|| vec!["precision".into(), "scale".into()]),
            nullable: Nullable::NullabilityNullable,
            case_sensitive: name == "VARCHAR",
            searchable: Searchable::Full,
            unsigned_attribute: radix.map(|_| false),
            fixed_prec_scale: name == "DECIMAL",
            auto_increment: Some(false),
            local_type_name: Some(name.into()),
            minimum_scale: (name == "DECIMAL").then_some(0),
            maximum_scale: (name == "DECIMAL").then_some(38),
            sql_data_type: data_type,
            datetime_subcode: None,
            num_prec_radix: radix,
            interval_precision: None,
        });
    };
    // In XDBC type code order, as the specification asks.
    add("BOOLEAN", XdbcDataType::XdbcBit, Some(1), None, None);
    add("BIGINT", XdbcDataType::XdbcBigint, Some(64), None, Some(2));
    add("DECIMAL", XdbcDataType::XdbcDecimal, Some(38), None, Some(10));
    add("INTEGER", XdbcDataType::XdbcInteger, Some(32), None, Some(2));
    add("DOUBLE", XdbcDataType::XdbcDouble, Some(53), None, Some(2));
    add("VARCHAR", XdbcDataType::XdbcVarchar, None, None, None);
    add("DATE", XdbcDataType::XdbcDate, Some(10), Some("DATE"), None);
    add("TIMESTAMP", XdbcDataType::XdbcTimestamp, Some(26), Some("TIMESTAMP"), None);
    types.build().expect("static type info builds")
}
